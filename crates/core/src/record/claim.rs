//! What a delivery asks for and what the claim statement answers: [`ClaimRequest`]
//! (checked by [`check_request`]), [`ClaimRow`] (the statement's columns) turned into a
//! [`ClaimReply`] by [`decide`], the one place that reads a claim's outcome.

use uuid::Uuid;

use super::result::Replay;
use crate::config::MAX_LEASE_SECONDS;
use crate::error::{Error, Result};
use crate::transitions::{ClaimVerdict, Met};

/// One delivery's request for a claim. Owned, so it can cross into a runtime
/// thread while the caller's language runtime goes on.
#[derive(Debug, Clone, Default)]
pub struct ClaimRequest {
    /// The job type (idempotency scope), e.g. `"ChargeOrderJob"`.
    pub job_type: String,
    /// The canonical operation key, e.g. `"42"`.
    pub operation_key: String,
    /// The delivering job's id, stored as the record's last claiming jid.
    pub delivery_id: Option<String>,
    /// Lease length in seconds (> 0).
    pub lease_seconds: f64,
    /// Digest of the delivery's canonical arguments (payload mismatch detection).
    pub args_digest: Option<String>,
    /// Job class, queue and arguments (JSON text) stored for `resolve(as: :rerun)`.
    pub job_class: Option<String>,
    /// The queue the delivery came from (see `job_class`).
    pub queue: Option<String>,
    /// The delivery's arguments, as JSON text (see `job_class`).
    pub args_json: Option<String>,
    /// Never take a claim over with a mismatched payload (`on_mismatch: :raise`).
    pub refuse_mismatch: bool,
    /// The door's facts about this delivery (delivery id, retry count, enqueued at…):
    /// a JSON object text, kept by a first claim (`first_facts`) and stored with the
    /// operation's repeats (`repeat_facts`).
    pub facts_json: Option<String>,
    /// A copy coming back: it met a live claim before (deferred, `deferrals` > 0) or
    /// decides again after waiting for one. It was counted in `duplicates` (and
    /// `mismatches`) when it first arrived and is not counted again; its return is
    /// still a repeat (`repeat_times`, `repeat_facts`). False for a copy's first
    /// arrival.
    pub returning: bool,
}

/// How a won claim was obtained (the decision table's type).
pub use crate::transitions::ClaimKind;

impl ClaimAnswer {
    /// What the claim statement decided, in the decision table's terms
    /// ([`crate::transitions::next`] takes it): a won claim and how, or what the
    /// delivery met.
    pub fn verdict(&self) -> ClaimVerdict {
        match self {
            ClaimAnswer::Claimed { kind, .. } => ClaimVerdict::Take(*kind),
            ClaimAnswer::Completed { .. } => ClaimVerdict::Met(Met::Completed),
            ClaimAnswer::Held { .. } => ClaimVerdict::Met(Met::Held),
            ClaimAnswer::GivenUp { .. } => ClaimVerdict::Met(Met::GivenUp),
            ClaimAnswer::InProgress { .. } => ClaimVerdict::Met(Met::Live),
            ClaimAnswer::Refused { .. } => ClaimVerdict::Met(Met::Refused),
        }
    }

    /// The outcome's name, as the Ruby layer and `repeat_facts` spell it.
    pub fn name(&self) -> &'static str {
        match self {
            ClaimAnswer::Claimed { kind, .. } => match kind {
                ClaimKind::First => "claimed",
                ClaimKind::Retry => "retry",
                ClaimKind::Takeover => "takeover",
            },
            ClaimAnswer::Completed { .. } => "completed",
            ClaimAnswer::InProgress { .. } => "in_progress",
            ClaimAnswer::Held { .. } => "held",
            ClaimAnswer::GivenUp { .. } => "given_up",
            ClaimAnswer::Refused { .. } => "refused",
        }
    }
}

/// What a delivery should do, decided atomically by the claim statement.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimAnswer {
    /// Run the job. `token` must be presented to every fenced change.
    Claimed {
        /// The claim's fencing token.
        token: Uuid,
        /// Claims made on this record, this one included (1 for a first claim).
        attempt: i32,
        /// First, retry (after a release) or takeover (of a stale claim).
        kind: ClaimKind,
        /// Stale takeovers of this record, this claim included when it is one (the
        /// record's `takeovers`; 0 when the statement that claimed did not read it).
        takeovers: i32,
    },
    /// The operation already completed: do not run. `duplicates` counts this one.
    /// `replay`: what its completion stored (None when no store was requested).
    Completed {
        /// The record's duplicate deliveries so far.
        duplicates: i32,
        /// See above.
        replay: Option<Replay>,
    },
    /// Another delivery holds a live claim: do not run now; try again once
    /// `lease_remaining` seconds have passed (by the database clock).
    InProgress {
        /// The holder's delivery id, if it gave one.
        holder_delivery_id: Option<String>,
        /// The holder's attempt (claims made on the record).
        attempt: i32,
        /// Seconds left of the holder's lease (> 0).
        lease_remaining: f64,
        /// The record's duplicate deliveries so far.
        duplicates: i32,
    },
    /// Held for a person (`:hold` policy): do not run.
    Held {
        /// The record's duplicate deliveries so far.
        duplicates: i32,
    },
    /// Given up (`:skip` policy): do not run.
    GivenUp {
        /// The record's duplicate deliveries so far.
        duplicates: i32,
    },
    /// The claim is released or stale, but this delivery's arguments differ from the
    /// claim's and mismatches are refused: do not run.
    Refused {
        /// The record's duplicate deliveries so far.
        duplicates: i32,
    },
}

/// The claim's answer: the outcome, and whether this delivery's arguments differed
/// from those of the operation's claim (a payload mismatch).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimReply {
    /// What the delivery should do.
    pub outcome: ClaimAnswer,
    /// The delivery's arguments differ from the claim's (its `args_digest`).
    pub mismatch: bool,
}

/// Checks a request before any statement: non-empty key and job type within
/// [`MAX_KEY_BYTES`](crate::config::MAX_KEY_BYTES), a lease in (0, [`MAX_LEASE_SECONDS`]],
/// no NUL character in the job type or the delivery's id, job class or queue (PostgreSQL's `text`
/// refuses one), facts a JSON object with no NUL.
///
/// Errors: [`Error::Config`] naming the job type.
pub fn check_request(req: &ClaimRequest) -> Result<()> {
    check_key(&req.job_type, &req.operation_key)?;
    if !(req.lease_seconds > 0.0 && req.lease_seconds <= MAX_LEASE_SECONDS) {
        return Err(Error::Config(format!(
            "the lease of {} must be a positive number of seconds up to {MAX_LEASE_SECONDS}, got {}",
            req.job_type, req.lease_seconds
        )));
    }
    let texts = [
        ("job type", Some(req.job_type.as_str())),
        ("id", req.delivery_id.as_deref()),
        ("job class", req.job_class.as_deref()),
        ("queue", req.queue.as_deref()),
    ];
    if let Some((field, _)) = texts
        .iter()
        .find(|(_, text)| text.is_some_and(|t| t.contains('\0')))
    {
        return Err(Error::Config(format!(
            "{}: the delivery's {field} holds a NUL character (U+0000), which PostgreSQL's \
             text cannot store; the job {}",
            req.job_type,
            crate::error::NOT_RUN
        )));
    }
    if let Some(facts) = &req.facts_json {
        let parsed = serde_json::from_str(facts);
        let Ok(value @ serde_json::Value::Object(_)) = &parsed else {
            // The text shown cut to 100 characters: a binding checks the facts first, so
            // only a hand-made request gets here, and it may be megabytes long.
            let shown: String = facts.chars().take(100).collect();
            let why = match &parsed {
                Err(e) => format!(" ({e})"),
                Ok(_) => String::new(),
            };
            return Err(Error::Config(format!(
                "{}: the delivery facts must be a JSON object text, got {shown:?}{why}; the job {}",
                req.job_type,
                crate::error::NOT_RUN
            )));
        };
        if holds_nul(value) {
            return Err(Error::Config(format!(
                "{}: the facts hold a NUL character (U+0000), which PostgreSQL's jsonb cannot \
                 store; the job {}",
                req.job_type,
                crate::error::NOT_RUN
            )));
        }
    }
    Ok(())
}

/// Whether a string (or an object's key) inside `value` holds U+0000. Walks without
/// recursion (a parsed value is at most 128 levels deep anyway).
fn holds_nul(value: &serde_json::Value) -> bool {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            serde_json::Value::String(s) if s.contains('\0') => return true,
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return true;
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    false
}

fn check_key(job_type: &str, operation_key: &str) -> Result<()> {
    if job_type.is_empty() {
        return Err(Error::Config("job_type must not be empty".into()));
    }
    if operation_key.is_empty() {
        return Err(Error::Config(format!(
            "the operation key of {job_type} must not be empty"
        )));
    }
    if let Some(problem) = crate::keys::size_problem(job_type.as_bytes(), operation_key.as_bytes())
    {
        return Err(Error::Config(format!(
            "the operation key of {job_type}: {problem}"
        )));
    }
    Ok(())
}

/// The columns [`CLAIM_SQL`](crate::sql::CLAIM_SQL) returns, read by whichever driver ran it (the native
/// pool, or ActiveRecord's connection for `idempotency_transaction: :active_record`).
#[derive(Debug, Clone)]
pub struct ClaimRow {
    /// The record holds this delivery's token: the claim is this delivery's.
    pub won: bool,
    /// The record's `status` after the statement (`claimed`, `completed`, `released`,
    /// `held`, `given_up`).
    pub status: String,
    /// How the last claim was obtained: `first`, `retry` or `takeover`.
    pub last_claim: String,
    /// Claims made on the record (its `attempts`).
    pub attempts: i32,
    /// The claiming delivery's id (the record's `jid`).
    pub delivery_id: Option<String>,
    /// The record's duplicate deliveries so far.
    pub duplicates: i32,
    /// The delivery's arguments differ from the claim's.
    pub mismatch: bool,
    /// Seconds left of the record's lease by the database clock (negative once it
    /// ran out; `inf` for a lease edited to end at 'infinity').
    pub lease_remaining: f64,
    /// The record's `takeovers` after the statement (0 when the driver did not read it).
    pub takeovers: i32,
    /// A completed record's stored result (JSON text) and `result_state` (V7).
    pub result: Option<String>,
    /// The record's `result_state` (see `result`).
    pub result_state: Option<String>,
}

/// Turns the row of [`CLAIM_SQL`](crate::sql::CLAIM_SQL) into the delivery's [`ClaimReply`]: the one place
/// that reads a claim's outcome. `token` is the token the caller sent as $3.
pub fn decide(row: ClaimRow, token: Uuid, req: &ClaimRequest) -> Result<ClaimReply> {
    let ClaimRow {
        won,
        status,
        last_claim,
        attempts: attempt,
        delivery_id,
        duplicates,
        mismatch,
        lease_remaining,
        takeovers,
        result,
        result_state,
    } = row;
    if status == "claimed" && !won && lease_remaining.is_infinite() && lease_remaining > 0.0 {
        // A lease ending at 'infinity' (edited by hand): the claim would never end, and
        // every copy would be deferred for ever. The same family as a column the core
        // cannot read (record::unreadable_column): names the record and the column, never
        // retried (the next delivery meets the same lease).
        return Err(Error::Unreadable(format!(
            "the record of {} operation {:?} holds a claim whose lease never ends: its column \
             lease_expires_at is 'infinity' (edited by hand): set lease_expires_at to a real \
             time, or resolve the operation; the job was not run, and it is not retried: the \
             next delivery meets the same lease",
            req.job_type, req.operation_key
        )));
    }
    let lease_remaining = lease_remaining.max(0.0);
    let outcome = if won {
        let kind = match last_claim.as_str() {
            "takeover" => ClaimKind::Takeover,
            "retry" => ClaimKind::Retry,
            _ => ClaimKind::First,
        };
        ClaimAnswer::Claimed {
            token,
            attempt,
            kind,
            takeovers,
        }
    } else {
        match status.as_str() {
            "completed" => ClaimAnswer::Completed {
                duplicates,
                replay: Replay::from_columns(result, result_state.as_deref())?,
            },
            "held" => ClaimAnswer::Held { duplicates },
            "given_up" => ClaimAnswer::GivenUp { duplicates },
            "claimed" if lease_remaining > 0.0 => ClaimAnswer::InProgress {
                holder_delivery_id: delivery_id,
                attempt,
                lease_remaining,
                duplicates,
            },
            "claimed" | "released" => ClaimAnswer::Refused { duplicates },
            other => {
                return Err(Error::Database {
                    message: format!(
                        "idempotency record {}/{} has status {other:?}, which this version of \
                         idempotent_job does not know (apply the latest migrations and upgrade \
                         idempotent_job)",
                        req.job_type, req.operation_key
                    ),
                    sqlstate: "XX000".into(),
                })
            }
        }
    };
    Ok(ClaimReply { outcome, mismatch })
}
