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
//!   [`OnMismatch::Raise`] refused with [`Error::PayloadMismatch`](crate::error::Error::PayloadMismatch) unless this
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
pub use channel::{Channel, Direct, Replaceable};
pub use delays::{
    claim_error_report, deferral_delay, deferrals_refused, delivery_count, unreachable_delay,
    CLAIM_ERROR_LOG_INTERVAL, COMPLETION_RETRY_DELAYS, DEFERRAL_FACTOR, DEFERRAL_FIRST_DELAY,
    MAX_DEFERRALS, UNREACHABLE_MAX_DELAY,
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

/// `text` cut to [`ERROR_TEXT_LIMIT`] characters, as `last_error` can store it: a NUL
/// character (which PostgreSQL's `text` refuses, failing the whole statement) written
/// as U+FFFD, so an exception's words never keep a claim from being released.
fn limited(text: &str) -> String {
    let cut = match text.char_indices().nth(ERROR_TEXT_LIMIT) {
        Some((at, _)) => &text[..at],
        None => text,
    };
    cut.replace('\0', "\u{fffd}")
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
    /// Errors: [`Error::Config`](crate::error::Error::Config) from [`JobOptions::validate`].
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

/// Most sets of door words a [`Told`] keeps (the oldest goes): several doors may run one
/// job's options, and one door may use several (an ActiveJob class alternates waiting in
/// place and re-enqueueing: two `defer_text`s).
pub const WORDS_KEPT: usize = 8;

/// One job's [`Protocol`], kept told in each set of door words it was used with (newest
/// last, at most [`WORDS_KEPT`]): a delivery finds its door's by comparing the words, so
/// a door whose words alternate rebuilds none. Shared by the threads of a worker.
#[derive(Debug)]
pub struct Told(std::sync::Mutex<Vec<std::sync::Arc<Protocol>>>);

impl Told {
    /// Keeps `protocol` (told in its own words).
    pub fn new(protocol: Protocol) -> Told {
        Told(std::sync::Mutex::new(vec![std::sync::Arc::new(protocol)]))
    }

    /// The protocol told with these `id_label`, `defer_text` and `crash_text` (the
    /// other words as the first protocol's): a kept one, or one told in them now and
    /// kept.
    pub fn in_words(
        &self,
        id_label: &str,
        defer_text: &str,
        crash_text: &str,
    ) -> std::sync::Arc<Protocol> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let same = |p: &&std::sync::Arc<Protocol>| {
            let w = &p.words;
            w.id_label == id_label && w.defer_text == defer_text && w.crash_text == crash_text
        };
        if let Some(found) = kept.iter().find(same) {
            return found.clone();
        }
        let first = &kept[0];
        let words = DoorWords {
            id_label: id_label.into(),
            defer_text: defer_text.into(),
            crash_text: crash_text.into(),
            ..first.words.clone()
        };
        let told = std::sync::Arc::new(Protocol {
            options: first.options.clone(),
            words,
        });
        if kept.len() >= WORDS_KEPT {
            // The first stays: it gives the other words and the options.
            kept.remove(1);
        }
        kept.push(told.clone());
        told
    }
}

#[cfg(test)]
mod told_tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn alternating_words_rebuild_none_and_the_oldest_goes() {
        let told =
            Told::new(Protocol::new("Job", JobOptions::default(), DoorWords::default()).unwrap());
        let waiting = told.in_words("job_id", "waiting in place for", "crash");
        let requeued = told.in_words("job_id", "re-enqueued after", "crash");
        assert!(!Arc::ptr_eq(&waiting, &requeued));
        assert_eq!(requeued.words().defer_text, "re-enqueued after");
        assert!(Arc::ptr_eq(
            &told.in_words("job_id", "waiting in place for", "crash"),
            &waiting
        ));
        assert!(Arc::ptr_eq(
            &told.in_words("job_id", "re-enqueued after", "crash"),
            &requeued
        ));
        for i in 0..WORDS_KEPT {
            told.in_words(&format!("id{i}"), "d", "c");
        }
        assert!(!Arc::ptr_eq(
            &told.in_words("job_id", "waiting in place for", "crash"),
            &waiting
        ));
        assert_eq!(told.0.lock().unwrap().len(), WORDS_KEPT);
    }
}
