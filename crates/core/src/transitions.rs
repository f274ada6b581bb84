//! The protocol's decision table as pure functions: the record's state × a delivery ×
//! the job's options → what the claim statement does and what the delivery does next,
//! and which fenced change the record accepts from which holder. No I/O, no clock: the
//! model check (`tests/model/`) explores the protocol through these functions.
//!
//! The running protocol decides through the same functions and types: `protocol.rs`
//! turns the claim statement's answer into a [`ClaimVerdict`] and takes every step
//! after it from [`next`] (run, ask the lookup, the stale policy, defer, skip, refuse a
//! mismatch), a lookup's from [`after_lookup`]; the job options [`OnStale`] and
//! [`OnMismatch`] and the claim's [`ClaimKind`] are defined here and re-exported by
//! `protocol` and `record`. The model and the core share the table by construction.
//!
//! The statements compute the same rules inside PostgreSQL (SQL cannot call Rust:
//! [`crate::sql::CLAIM_SQL`]'s `take`, the fenced statements' guards, `RESOLVE_SQL`):
//! `tests/conformance/` runs every decision, fenced and resolve case of the
//! conformance vectors (`conformance/vectors.json`) through those statements and the
//! protocol on a real database and through these functions, and fails when they
//! disagree, so they cannot drift apart unnoticed.
//!
//! ```text
//!  state \ delivery     same payload                      different payload, on_mismatch raise
//!  absent               take: first → run                 take: first → run
//!  claimed, live        in progress (defer)               refused (error: payload mismatch)
//!  claimed, expired     take: takeover → lookup / stale   refused (error: payload mismatch)
//!  released             take: retry → run                 refused (error: payload mismatch)
//!  completed            completed (skip)                  refused (error: payload mismatch)
//!  held / given up      held / given up (skip)            refused (error: payload mismatch)
//! ```
//!
//! With `on_mismatch: log` a different payload decides as the same payload would (and
//! is noted). A takeover asks the lookup when one is declared; otherwise, and when the
//! lookup answers unknown, the stale policy decides: reclaim → run, hold → held,
//! skip → given up.

use crate::error::{Error, Result};

/// The record's status column, as the core's statements write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// A delivery holds the claim (its fencing token) until its lease ends.
    Claimed,
    /// The body ran and its completion was recorded: never run again.
    Completed,
    /// The holder's body raised and released the claim: the next delivery retries.
    Released,
    /// A stale claim held for a person (`on_stale: hold`): not run until resolved.
    Held,
    /// A stale claim given up (`on_stale: skip`): not run until resolved.
    GivenUp,
}

impl Status {
    /// The stored name: `"claimed"`, `"completed"`, `"released"`, `"held"`, `"given_up"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Claimed => "claimed",
            Status::Completed => "completed",
            Status::Released => "released",
            Status::Held => "held",
            Status::GivenUp => "given_up",
        }
    }

    /// The status named `name` ([`Status::as_str`]), or `None`.
    pub fn parse(name: &str) -> Option<Status> {
        [
            Status::Claimed,
            Status::Completed,
            Status::Released,
            Status::Held,
            Status::GivenUp,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

/// The record as the claim statement meets it: absent, or its status and, for a
/// claim, whether its lease has run out by the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// No idempotency record for the operation key yet.
    Absent,
    /// A record exists.
    Present {
        /// Its status.
        status: Status,
        /// Its lease has run out (meaningful for a claim: a stale claim).
        lease_expired: bool,
    },
}

/// What a delivery does with a stale claim (its holder's lease ran out: the holder may
/// have died before or after its effect) when no lookup knows better: the job option
/// `on_stale` (`protocol::JobOptions::on_stale`), by its effect on a takeover
/// ([`stale`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum OnStale {
    /// Run the body again (a rare duplicate if the holder had done the effect). Default.
    #[default]
    Reclaim,
    /// Do not run; hold the operation for a person (`resolve`).
    Hold,
    /// Do not run; give the operation up (a rare miss).
    Skip,
}

impl OnStale {
    /// The option value's name: `"reclaim"`, `"hold"`, `"skip"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnStale::Reclaim => "reclaim",
            OnStale::Hold => "hold",
            OnStale::Skip => "skip",
        }
    }

    /// Parses an option value.
    ///
    /// Errors: [`Error::Config`] naming `job` and the accepted values.
    pub fn parse(job: &str, value: &str) -> Result<OnStale> {
        match value {
            "reclaim" => Ok(OnStale::Reclaim),
            "hold" => Ok(OnStale::Hold),
            "skip" => Ok(OnStale::Skip),
            other => Err(Error::Config(format!(
                "{job}: on_stale must be reclaim, hold or skip, got {other:?}"
            ))),
        }
    }
}

/// What a delivery whose payload differs from its claim's (same operation key) does:
/// the job option `on_mismatch` (`protocol::JobOptions::on_mismatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnMismatch {
    /// Note it (a warning and a `mismatch` event) and go on. Default.
    #[default]
    Log,
    /// Also refuse the delivery ([`Error::PayloadMismatch`]) unless it won the claim; it
    /// never takes a released or stale claim ([`claim`]).
    Raise,
}

impl OnMismatch {
    /// The option value's name: `"log"`, `"raise"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnMismatch::Log => "log",
            OnMismatch::Raise => "raise",
        }
    }

    /// Parses an option value.
    ///
    /// Errors: [`Error::Config`] naming `job` and the accepted values.
    pub fn parse(job: &str, value: &str) -> Result<OnMismatch> {
        match value {
            "log" => Ok(OnMismatch::Log),
            "raise" => Ok(OnMismatch::Raise),
            other => Err(Error::Config(format!(
                "{job}: on_mismatch must be log or raise, got {other:?}"
            ))),
        }
    }
}

/// The options that decide: the stale policy, the mismatch rule, a declared lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rules {
    /// What a takeover of a stale claim does when no lookup knows better.
    pub on_stale: OnStale,
    /// [`OnMismatch::Raise`]: a delivery whose payload differs never takes a claim and
    /// is refused unless it won.
    pub on_mismatch: OnMismatch,
    /// A lookup is declared: a takeover asks it before the stale policy.
    pub lookup: bool,
}

/// How a claim was won (stored as `last_claim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimKind {
    /// No record existed: the first delivery of this operation.
    First,
    /// The previous holder's job raised and released its claim (a Sidekiq retry), or a
    /// person resolved a held operation for a rerun.
    Retry,
    /// The previous claim's lease had expired: its holder may have died. Its effect
    /// may or may not have happened (a stale claim): the stale policy decides.
    Takeover,
}

impl ClaimKind {
    /// The name stored in `last_claim`: `"first"`, `"retry"`, `"takeover"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::First => "first",
            ClaimKind::Retry => "retry",
            ClaimKind::Takeover => "takeover",
        }
    }
}

/// What the claim statement decides for one delivery ([`claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimVerdict {
    /// The delivery's token becomes the record's: status `claimed`, a fresh lease.
    Take(ClaimKind),
    /// Nothing changes but the duplicate count; the delivery met this.
    Met(Met),
}

/// What a delivery that did not take the claim met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Met {
    /// A completed operation.
    Completed,
    /// An operation held for a person.
    Held,
    /// An operation given up.
    GivenUp,
    /// A live claim of another delivery.
    Live,
    /// A released or expired claim this payload may not take (`on_mismatch: raise`).
    Refused,
}

/// The claim statement's rule ([`crate::sql::CLAIM_SQL`]'s `take`): a delivery takes
/// the claim when there is no record, or the record is released, or claimed with its
/// lease run out — unless its payload differs (`mismatch`) and mismatches are refused.
pub fn claim(state: RecordState, mismatch: bool, on_mismatch: OnMismatch) -> ClaimVerdict {
    let (status, expired) = match state {
        RecordState::Absent => return ClaimVerdict::Take(ClaimKind::First),
        RecordState::Present {
            status,
            lease_expired,
        } => (status, lease_expired),
    };
    let takeable = status == Status::Released || (status == Status::Claimed && expired);
    if takeable && !(mismatch && on_mismatch == OnMismatch::Raise) {
        return ClaimVerdict::Take(if status == Status::Released {
            ClaimKind::Retry
        } else {
            ClaimKind::Takeover
        });
    }
    ClaimVerdict::Met(match status {
        Status::Completed => Met::Completed,
        Status::Held => Met::Held,
        Status::GivenUp => Met::GivenUp,
        Status::Claimed if !expired => Met::Live,
        Status::Claimed | Status::Released => Met::Refused,
    })
}

/// What a delivery does after its claim statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Next {
    /// Run the body under the claim, then complete (returned) or release (raised).
    Run,
    /// Ask the lookup whether the stale holder's effect happened ([`after_lookup`]).
    AskLookup,
    /// Hold the operation for a person (fenced `hold`), do not run.
    Hold,
    /// Give the operation up (fenced `give_up`), do not run.
    GiveUp,
    /// Mark it completed without running (a lookup answered done: fenced `complete`).
    Complete,
    /// Do not run: a duplicate (completed, held, given up).
    Skip,
    /// Do not run now: come back after the deferral's delay.
    Defer,
    /// Do not run: the payload differs and mismatches are refused
    /// ([`crate::error::Error::PayloadMismatch`]).
    RefuseMismatch,
}

/// What a lookup answered about a stale holder's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The effect happened: complete without running.
    Done,
    /// The effect did not happen: run.
    NotDone,
    /// The lookup cannot tell: the stale policy decides.
    Unknown,
}

/// The stale policy's step for a claim taken over when no lookup knows better.
pub fn stale(policy: OnStale) -> Next {
    match policy {
        OnStale::Reclaim => Next::Run,
        OnStale::Hold => Next::Hold,
        OnStale::Skip => Next::GiveUp,
    }
}

/// The step after a lookup's answer: done → complete without running, not done → run,
/// unknown → the stale policy.
pub fn after_lookup(answer: Answer, policy: OnStale) -> Next {
    match answer {
        Answer::Done => Next::Complete,
        Answer::NotDone => Next::Run,
        Answer::Unknown => stale(policy),
    }
}

/// The delivery's step after the claim statement's `verdict`: a first claim or a retry
/// runs; a takeover asks the lookup or applies the stale policy; a live claim defers;
/// a mismatch under `on_mismatch: raise` that did not win is refused (whatever it met);
/// anything else is skipped.
pub fn next(verdict: ClaimVerdict, mismatch: bool, rules: Rules) -> Next {
    match verdict {
        ClaimVerdict::Take(ClaimKind::First | ClaimKind::Retry) => Next::Run,
        ClaimVerdict::Take(ClaimKind::Takeover) if rules.lookup => Next::AskLookup,
        ClaimVerdict::Take(ClaimKind::Takeover) => stale(rules.on_stale),
        ClaimVerdict::Met(_) if mismatch && rules.on_mismatch == OnMismatch::Raise => {
            Next::RefuseMismatch
        }
        ClaimVerdict::Met(Met::Live) => Next::Defer,
        ClaimVerdict::Met(Met::Refused) => Next::RefuseMismatch,
        ClaimVerdict::Met(_) => Next::Skip,
    }
}

/// A change only the claim's holder may make (the fenced statements of
/// `fenced`), and a person's resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Record the completion (status `completed`).
    Complete,
    /// Release the claim after the body raised (status `released`).
    Release,
    /// Hold the operation for a person (status `held`).
    Hold,
    /// Give the operation up (status `given_up`).
    GiveUp,
    /// End the lease now (a failed lookup).
    Expire,
    /// Renew the lease (heartbeat).
    Renew,
}

/// Whether the record accepts `change` from a holder presenting `token_matches` (its
/// token is the record's) on a record in `status`, and the status after it. Every
/// fenced statement requires the caller's token; completion, release, hold and give-up
/// also accept a repeat of themselves (the status they set), so a statement sent again
/// after a lost answer succeeds. The lease is not checked: a holder whose lease ran
/// out still completes while nobody took the claim over.
pub fn fenced(change: Change, status: Status, token_matches: bool) -> Option<Status> {
    if !token_matches {
        return None;
    }
    let (own, after) = match change {
        Change::Complete => (Some(Status::Completed), Status::Completed),
        Change::Release => (Some(Status::Released), Status::Released),
        Change::Hold => (Some(Status::Held), Status::Held),
        Change::GiveUp => (Some(Status::GivenUp), Status::GivenUp),
        Change::Expire | Change::Renew => (None, Status::Claimed),
    };
    (status == Status::Claimed || Some(status) == own).then_some(after)
}

/// How a person settles a held or given-up operation (`resolve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// The effect happened: completed.
    Done,
    /// Run it again: released, so the next delivery claims it as a retry.
    Rerun,
}

/// The status after `resolve` of a record in `status`, or `None` when there is nothing
/// to resolve (only held and given-up operations are).
pub fn resolve(status: Status, resolution: Resolution) -> Option<Status> {
    matches!(status, Status::Held | Status::GivenUp).then_some(match resolution {
        Resolution::Done => Status::Completed,
        Resolution::Rerun => Status::Released,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_never_takes_under_raise_and_is_refused_whatever_it_met() {
        let expired = RecordState::Present {
            status: Status::Claimed,
            lease_expired: true,
        };
        assert_eq!(
            claim(expired, true, OnMismatch::Raise),
            ClaimVerdict::Met(Met::Refused)
        );
        assert_eq!(
            claim(expired, true, OnMismatch::Log),
            ClaimVerdict::Take(ClaimKind::Takeover)
        );
        let rules = Rules {
            on_stale: OnStale::Reclaim,
            on_mismatch: OnMismatch::Raise,
            lookup: false,
        };
        assert_eq!(
            next(ClaimVerdict::Met(Met::Completed), true, rules),
            Next::RefuseMismatch
        );
        assert_eq!(
            next(ClaimVerdict::Take(ClaimKind::First), true, rules),
            Next::Run
        );
    }

    #[test]
    fn fenced_changes_need_the_token() {
        assert_eq!(
            fenced(Change::Complete, Status::Claimed, true),
            Some(Status::Completed)
        );
        assert_eq!(fenced(Change::Complete, Status::Claimed, false), None);
        assert_eq!(
            fenced(Change::Complete, Status::Completed, true),
            Some(Status::Completed)
        );
        assert_eq!(fenced(Change::Complete, Status::Released, true), None);
        assert_eq!(fenced(Change::Renew, Status::Completed, true), None);
        assert_eq!(resolve(Status::Claimed, Resolution::Done), None);
        assert_eq!(
            resolve(Status::Held, Resolution::Rerun),
            Some(Status::Released)
        );
    }
}
