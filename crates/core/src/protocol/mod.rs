//! The claim protocol: what one delivery does after the claim statement, for every
//! language. A binding (Ruby, Python) calls these functions in order and only runs
//! user code between them: the job body, the stale-claim lookup, event subscribers
//! and the logger.
//!
//! ```text
//!            Protocol::begin ──► Step::Skip(outcome)         not run: completed, held,
//!                 │                                          given up, refused
//!                 ├───────────► Step::InProgress(outcome)    not run: come back after
//!                 │                                          outcome.retry_after
//!                 ├───────────► Step::AskLookup(claim) ──► binding runs the lookup ──►
//!                 │                                         Protocol::after_lookup ──► Run / Skip
//!                 └───────────► Step::Run(claim) ──► binding runs the body, then:
//!                                   returned  → Protocol::complete(claim, value)
//!                                   raised    → Protocol::release(claim, class, message)
//!                                   a crash   → Protocol::keep(claim)   (door's rule)
//! ```
//!
//! * first claim, or a retry after the body raised ([`ClaimKind::Retry`]) → run;
//! * a stale claim taken over ([`ClaimKind::Takeover`]) → the lookup, when one is
//!   declared ([`JobOptions::lookup`]), then the stale policy ([`OnStale`]);
//! * a live claim of another delivery → in progress, with the deferral's delay
//!   ([`deferral_delay`]);
//! * completed, held, given up, refused → skip; the record counted the duplicate;
//! * a payload that differs from the claim's → noted, and under
//!   [`OnMismatch::Raise`] refused with [`Error::PayloadMismatch`] unless this
//!   delivery won the claim;
//! * the completion is retried ([`COMPLETION_RETRY_DELAYS`]) outside a transaction;
//! * a raising body releases its claim; a crash (the binding's door decides what is
//!   one) keeps it until its lease ends.
//!
//! The statements go through a [`Channel`]: [`Direct`] (the pool, one statement per
//! checkout: heartbeat, release and completion retries), or a native transaction
//! ([`crate::session::Session`]: claim, body and completion commit together; no
//! heartbeat, no release, the completion written once).
//!
//! What happened is told as [`Note`]s pushed onto the caller's [`Notes`]: each one an
//! event (name and details) and/or a log line (level and text). Nothing is formatted
//! until the binding asks ([`Note::text`], [`Note::details`]), so a delivery nobody
//! listens to costs no strings. Notes pushed before an error are kept: the binding
//! publishes them, then raises.

mod channel;
mod decide;
mod delays;
mod finish;
mod job_options;
mod note;
mod outcome;
mod perform;
mod request;

pub use crate::record::ClaimKind;
/// The job options the decision table decides by, re-exported from it: one type for the
/// running protocol and the model check.
pub use crate::transitions::{OnMismatch, OnStale};
pub use channel::{Channel, Direct};
pub use delays::{
    claim_error_report, deferral_delay, unreachable_delay, CLAIM_ERROR_LOG_INTERVAL,
    COMPLETION_RETRY_DELAYS, DEFERRAL_FACTOR, DEFERRAL_FIRST_DELAY, UNREACHABLE_MAX_DELAY,
};
pub use job_options::{JobOptions, DEFAULT_DEFER_MARGIN_SECONDS, MIN_LEASE_SECONDS};
pub use note::{Detail, DoorWords, Level, Note, NoteKind, Notes};
pub use outcome::{Claim, ClaimInfo, Completion, Decision, LookupAnswer, Outcome, Step};
pub use perform::{Body, Host, Performed};
pub use request::{reclaim_budget_reason, DeliveryRequest, WAIT_MARGIN_SECONDS};

use crate::conn::Interrupt;
use crate::error::Result;
use crate::fenced::Fenced;
use crate::transitions::{Next, Rules};

/// Longest error text stored in `last_error` (a release's or a failed lookup's), in
/// characters.
pub const ERROR_TEXT_LIMIT: usize = 1000;

/// `text` cut to [`ERROR_TEXT_LIMIT`] characters.
fn limited(text: &str) -> &str {
    match text.char_indices().nth(ERROR_TEXT_LIMIT) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// The protocol of one job type: its options, checked once. Cheap to share; every
/// method takes the delivery's [`Channel`], the caller's [`Interrupt`] and the
/// [`Notes`] to push onto.
#[derive(Debug, Clone)]
pub struct Protocol {
    options: JobOptions,
    words: DoorWords,
}

impl Protocol {
    /// The protocol of job type `job` (named in errors) with `options`, told in
    /// `words` (the door's: how its errors and log lines name things).
    ///
    /// Errors: [`Error::Config`] from [`JobOptions::validate`].
    pub fn new(job: &str, options: JobOptions, words: DoorWords) -> Result<Protocol> {
        options.validate(job)?;
        Ok(Protocol { options, words })
    }

    /// The options.
    pub fn options(&self) -> &JobOptions {
        &self.options
    }

    /// The door's words ([`Note::text`] takes them).
    pub fn words(&self) -> &DoorWords {
        &self.words
    }

    /// The same protocol told in other `words` (its options stay as checked).
    pub fn in_words(&self, words: DoorWords) -> Protocol {
        Protocol {
            options: self.options.clone(),
            words,
        }
    }

    /// The options that decide, as the decision table ([`transitions`]) takes them,
    /// for a claim with `takeovers` stale takeovers (see [`Protocol::stale_policy`]).
    pub(super) fn rules(&self, takeovers: i32) -> Rules {
        Rules {
            on_stale: self.stale_policy(takeovers),
            on_mismatch: self.options.on_mismatch,
            lookup: self.options.lookup.is_some(),
        }
    }

    /// Why the reclaim budget holds a claim with `takeovers` stale takeovers (more than
    /// `max_takeovers`), or `None` when it does not.
    pub(super) fn budget_spent(&self, takeovers: i32) -> Option<String> {
        self.options
            .max_takeovers
            .filter(|max| takeovers > *max)
            .map(|max| reclaim_budget_reason(takeovers, max))
    }

    /// The job's `on_stale`, unless the reclaim budget is spent: then hold, whatever
    /// `on_stale` says.
    pub(super) fn stale_policy(&self, takeovers: i32) -> OnStale {
        if self.budget_spent(takeovers).is_some() {
            return OnStale::Hold;
        }
        self.options.on_stale
    }

    /// The decision table's step for a claim taken over whose lookup (if any) did not
    /// know ([`transitions::stale`] through [`transitions::next`] or
    /// [`transitions::after_lookup`]): `Run` reclaims, `Hold` and `GiveUp` make the
    /// fenced change and skip. A hold by the reclaim budget says why in the record's
    /// `last_error`, the `held` event's `reason` and the log line.
    pub(super) fn stale_step(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        claim: Claim,
        next: Next,
        notes: &mut Notes,
    ) -> Result<Step> {
        let why = self.options.lookup.clone();
        let budget = (next == Next::Hold && self.options.on_stale != OnStale::Hold)
            .then(|| self.budget_spent(claim.takeovers))
            .flatten();
        let (change, decision) = match next {
            Next::Hold => (Fenced::Hold, Decision::Held),
            Next::GiveUp => (Fenced::GiveUp, Decision::GivenUp),
            // Run: the only other step transitions::stale gives.
            _ => {
                notes.push(Note::claim(
                    &claim.info,
                    NoteKind::Reclaimed { lookup: why },
                ));
                return Ok(self.run(channel, claim));
            }
        };
        channel.fenced(interrupt, change, &claim.info, budget.as_deref())?;
        let kind = match decision {
            Decision::Held => NoteKind::Held {
                lookup: why,
                budget,
            },
            _ => NoteKind::GivenUp { lookup: why },
        };
        notes.push(Note::claim(&claim.info, kind));
        let mut outcome = Outcome::of(decision);
        outcome.claim = Some(claim.info.clone());
        Ok(Step::Skip(outcome))
    }
}
