//! What a delivery ended with: [`Decision`], [`Outcome`], the [`Claim`] it holds, the
//! [`Step`] the protocol answers and the lookup's answer.

use std::time::Instant;

use uuid::Uuid;

use crate::heartbeat::{Heartbeat, HeartbeatReader, HeartbeatReport};
use crate::record::ResultState;

use super::*;

/// What a delivery ended with, by name ([`Decision::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The body ran and returned; its completion was recorded (or at least attempted:
    /// see [`Completion::recorded`]).
    Ran,
    /// Already completed (or a stale claim's lookup said it was done): not run.
    Completed,
    /// Held for a person (the `hold` stale policy, now or before): not run.
    Held,
    /// Given up (the `skip` stale policy, now or before): not run.
    GivenUp,
    /// Another delivery holds a live claim: not run; come back after
    /// [`Outcome::retry_after`].
    InProgress,
    /// The record refuses this payload (`on_mismatch: raise` on a released or stale
    /// claim): not run. [`Protocol::begin`] raises [`Error::PayloadMismatch`](crate::error::Error::PayloadMismatch) first.
    Refused,
}

impl Decision {
    /// `"ran"`, `"completed"`, `"held"`, `"given_up"`, `"in_progress"`, `"refused"`:
    /// the names every binding shows (`outcome.decision`).
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Ran => "ran",
            Decision::Completed => "completed",
            Decision::Held => "held",
            Decision::GivenUp => "given_up",
            Decision::InProgress => "in_progress",
            Decision::Refused => "refused",
        }
    }
}

/// Who holds a claim: plain data, cloned into outcomes and notes.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimInfo {
    /// The job type of the claimed record.
    pub job_type: String,
    /// The operation key of the claimed record.
    pub operation_key: String,
    /// The claiming delivery's id.
    pub delivery_id: Option<String>,
    /// The fencing token every change of this claim presents.
    pub token: Uuid,
    /// Claims made on the record, this one included (1 for a first claim).
    pub attempt: i32,
    /// How the claim was obtained.
    pub kind: ClaimKind,
}

/// A claim this delivery holds, owned by the binding between protocol calls. Give it
/// back to exactly one of [`Protocol::after_lookup`] (after [`Step::AskLookup`]),
/// [`Protocol::complete`], [`Protocol::release`] or [`Protocol::keep`] (after
/// [`Step::Run`]). Dropping it instead stops its heartbeat and leaves the record
/// claimed until its lease ends (as a crash does).
#[derive(Debug)]
pub struct Claim {
    pub(super) info: ClaimInfo,
    /// The lease renewal while the body runs (started with [`Step::Run`] when the
    /// options and the channel have one).
    pub(super) heartbeat: Option<Heartbeat>,
    /// When [`Step::Run`] was handed out: the body's duration counts from here.
    pub(super) started: Instant,
    /// Stale takeovers of the operation, this claim included when it is one (the
    /// record's `takeovers`): what the reclaim budget (`max_takeovers`) is checked on.
    pub(super) takeovers: i32,
}

impl Claim {
    pub(super) fn new(info: ClaimInfo, takeovers: i32) -> Claim {
        Claim {
            info,
            heartbeat: None,
            started: Instant::now(),
            takeovers,
        }
    }

    /// Who holds the claim.
    pub fn info(&self) -> &ClaimInfo {
        &self.info
    }

    /// What the heartbeat saw so far (renewals, failures, `in_doubt`…), or `None`
    /// without one (heartbeat off, a transaction, or not running the body yet).
    pub fn heartbeat_report(&self) -> Option<HeartbeatReport> {
        self.heartbeat.as_ref().map(Heartbeat::report)
    }

    /// A reader of the claim's heartbeat (see [`Claim::heartbeat_report`]), or `None`
    /// without one.
    pub fn heartbeat_reader(&self) -> Option<HeartbeatReader> {
        self.heartbeat.as_ref().map(Heartbeat::reader)
    }

    /// Stops the heartbeat and notes what it found: a claim lost while the body ran
    /// (a `lost_claim` event and an error line) or renewing stopped at max_run (a
    /// warning). [`Protocol::complete`], [`Protocol::release`] and [`Protocol::keep`]
    /// call it; a binding calls it itself when the body ended in a way that reaches
    /// none of them (a killed thread), so a dead body's lease runs out. Idempotent.
    pub fn stop_heartbeat(&mut self, notes: &mut Notes) {
        let Some(heartbeat) = self.heartbeat.take() else {
            return;
        };
        let report = heartbeat.stop();
        if report.lost {
            notes.push(Note::claim(
                &self.info,
                NoteKind::LostClaim {
                    during: "heartbeat",
                    error: None,
                },
            ));
        } else if report.max_run_reached {
            notes.push(Note::claim(&self.info, NoteKind::MaxRunReached));
        }
    }
}

/// What a delivery ended with (or, for [`Step::InProgress`], what it met).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// What was decided: ran, completed, held, given up, in progress, refused.
    pub decision: Decision,
    /// For a duplicate (completed, held, given up, in progress, refused met by the
    /// claim statement): the record's duplicate count so far, this one included.
    pub duplicates: Option<i32>,
    /// For [`Decision::InProgress`]: seconds after which to deliver again
    /// ([`deferral_delay`]).
    pub retry_after: Option<f64>,
    /// For [`Decision::InProgress`]: seconds until the holder's lease ends.
    pub lease_remaining: Option<f64>,
    /// For [`Decision::InProgress`]: the holder's delivery id.
    pub holder: Option<String>,
    /// The claim this delivery held: [`Decision::Ran`], and a takeover that did not run
    /// (completed by its lookup, held, given up).
    pub claim: Option<ClaimInfo>,
    /// For [`Decision::Completed`] met by the claim statement: the first run's stored
    /// result as JSON text, when it stored one (`store_result`). Always `None` until
    /// the record has its result column (migration V7, the stored-results work).
    pub result_json: Option<String>,
    /// What became of the result `store_result` asked to keep: for [`Decision::Ran`]
    /// this run's completion's, for a replayed [`Decision::Completed`] the first run's
    /// (then [`Outcome::replayed`]); `None` when no store was requested.
    pub result_state: Option<ResultState>,
    /// For [`Decision::InProgress`] when the delivery asked to wait
    /// ([`DeliveryRequest::wait_seconds`]) and the channel can: the binding tells the
    /// notes so far, then calls [`Protocol::wait`] (nothing was deferred; no
    /// `retry_after`). `None`: defer as usual.
    pub wait_seconds: Option<f64>,
    /// The delivery waited for a live claim to end (`wait=`) before this outcome: a
    /// completed operation replayed after the wait shows as `waited`
    /// ([`crate::telemetry::outcome_label`]).
    pub waited: bool,
}

impl Outcome {
    pub(super) fn of(decision: Decision) -> Outcome {
        Outcome {
            decision,
            duplicates: None,
            retry_after: None,
            lease_remaining: None,
            holder: None,
            claim: None,
            result_json: None,
            result_state: None,
            wait_seconds: None,
            waited: false,
        }
    }

    /// The outcome's label for telemetry ([`crate::telemetry::outcome_label`]):
    /// `ran`, `reclaimed`, `replayed`, `waited`, `skipped`, `in_progress`, `held`,
    /// `given_up` or `refused`.
    pub fn label(&self) -> &'static str {
        crate::telemetry::outcome_label(
            self.decision.as_str(),
            self.replayed(),
            self.claim.as_ref().map(|c| c.kind.as_str()),
            self.waited,
        )
    }

    /// Whether the body ran (and returned).
    pub fn ran(&self) -> bool {
        self.decision == Decision::Ran
    }

    /// Whether this is a replay: a repeat of a completed operation answered with the
    /// first run's stored result ([`Outcome::result_json`]). A completion asked to store
    /// a result it could not store (too large, not JSON) is not replayed: its repeat
    /// carries [`Outcome::result_state`] to say why, and is labelled `skipped`. Every
    /// binding's `replayed` is this.
    pub fn replayed(&self) -> bool {
        self.decision == Decision::Completed && self.result_state == Some(ResultState::Stored)
    }
}

/// What the binding does next.
#[derive(Debug)]
pub enum Step {
    /// Run the body under this claim (its heartbeat already renewing), then hand the
    /// claim to [`Protocol::complete`] (the body returned), [`Protocol::release`] (it
    /// raised) or [`Protocol::keep`] (a crash).
    Run(Claim),
    /// A stale claim was taken over and a lookup is declared: ask it whether the
    /// effect happened (`lookup(operation_key)`), then call [`Protocol::after_lookup`].
    AskLookup(Claim),
    /// Do not run: the outcome says why (completed, held, given up, refused).
    Skip(Outcome),
    /// Do not run now: another delivery holds a live claim. The door brings the
    /// delivery back after `outcome.retry_after` seconds (a deferral).
    InProgress(Outcome),
}

/// What a stale claim's lookup answered.
#[derive(Debug, Clone, PartialEq)]
pub enum LookupAnswer {
    /// The effect happened: the claim is marked completed, the body not run.
    Done,
    /// It did not: the body runs.
    NotDone,
    /// The lookup cannot tell: the stale policy decides.
    Unknown,
    /// The lookup answered something else; `answer` is how the binding prints it.
    Invalid {
        /// The answer, as the binding prints it.
        answer: String,
    },
    /// The lookup raised (or could not be called); `error` is `"Class: message"`.
    Raised {
        /// `"Class: message"`.
        error: String,
    },
}

impl LookupAnswer {
    /// The names of the answers a lookup gives, as every binding spells them (Ruby's
    /// Symbols `:done`…, Python's strings `"done"`…): [`LookupAnswer::Done`],
    /// [`LookupAnswer::NotDone`], [`LookupAnswer::Unknown`].
    pub const NAMES: [&'static str; 3] = ["done", "not_done", "unknown"];

    /// The one parse of a lookup's answer for every binding: the answer named `name`
    /// (one of [`Self::NAMES`]), else [`LookupAnswer::Invalid`] with `shown()` (how the
    /// binding prints the value: `:maybe`, `'maybe'`, `true`), which the core's
    /// [`Error::Lookup`](crate::error::Error::Lookup) message names. `name` is `None`
    /// for a value that is no name at all (not a Symbol or String).
    pub fn parse(name: Option<&str>, shown: impl FnOnce() -> String) -> LookupAnswer {
        match name {
            Some("done") => LookupAnswer::Done,
            Some("not_done") => LookupAnswer::NotDone,
            Some("unknown") => LookupAnswer::Unknown,
            _ => LookupAnswer::Invalid { answer: shown() },
        }
    }

    /// The answer's name of [`Self::NAMES`], `None` for an invalid answer or a raise.
    pub fn name(&self) -> Option<&'static str> {
        match self {
            LookupAnswer::Done => Some(Self::NAMES[0]),
            LookupAnswer::NotDone => Some(Self::NAMES[1]),
            LookupAnswer::Unknown => Some(Self::NAMES[2]),
            _ => None,
        }
    }

    /// The answers listed for a message, each between `before` and `after` as the
    /// binding spells a name (`(":", "")`: `:done, :not_done or :unknown`; `("\"",
    /// "\"")`: `"done", "not_done" or "unknown"`).
    pub fn listed(before: &str, after: &str) -> String {
        let [done, not_done, unknown] = Self::NAMES.map(|n| format!("{before}{n}{after}"));
        format!("{done}, {not_done} or {unknown}")
    }
}

/// What [`Protocol::complete`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// [`Decision::Ran`], with the claim.
    pub outcome: Outcome,
    /// The completion is recorded. False only outside a transaction, after every
    /// attempt failed (an error line says so): the record stays claimed until its
    /// lease ends.
    pub recorded: bool,
    /// Attempts made (1 when the first succeeded).
    pub attempts: u32,
    /// The body's value was stored with the completion (`store_result`;
    /// `outcome.result_state` says why not when it was asked and not stored).
    pub result_stored: bool,
}
