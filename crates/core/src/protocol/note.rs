//! What the protocol tells the binding about a delivery: [`Note`]s, each an event
//! (a name from the events table and its details) and/or a log line (a level and a
//! text). Built as plain data; names, details and texts are made only when asked, so
//! a delivery nobody listens to and nothing logs costs no strings.
//!
//! A claim's note carries its attempt: its event's subject is `job_type`,
//! `operation_key`, `jid` (the delivery id) and `attempt`; a delivery's note (no
//! claim: mismatch, deferred, skipped) has `job_type`, `operation_key`, `jid`. The
//! binding takes the subject from the [`DeliveryRequest`] it sent.

use crate::record::{ClaimKind, ResultState};

use super::{ClaimInfo, Decision, DeliveryRequest};

/// A log line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// What a delivery did in the ordinary course (claimed again, deferred, skipped).
    Info,
    /// Worth a look: a mismatch, a stale claim (held, given up, run again, or settled
    /// by its lookup), a result not stored, a crash, max_run reached.
    Warn,
    /// Something failed: a refused mismatch, a lookup, a lost claim, a completion, a
    /// release.
    Error,
}

impl Level {
    /// `"info"`, `"warn"`, `"error"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// An event detail's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Detail {
    /// One of a few names (a Symbol in Ruby, a str in Python): `kind`, `decision`,
    /// `answer`, `during`.
    Name(&'static str),
    /// Text (an error class name, a holder's delivery id).
    Text(String),
    /// Seconds, or another number with a fraction.
    Float(f64),
    /// A count.
    Int(i64),
    /// Yes or no (`refused`, `replayed`).
    Bool(bool),
    /// Absent (a holder without delivery id).
    Null,
}

/// How the binding's door and language say things in log lines and errors.
#[derive(Debug, Clone, PartialEq)]
pub struct DoorWords {
    /// The word for a delivery's id: `"jid"` (Sidekiq), `"job_id"` (ActiveJob),
    /// `"task"` (Celery), `"delivery"` (plain). Default `"delivery"`.
    pub id_label: String,
    /// How a deferral is said, before its delay: `"retry after"`, `"rescheduled in"`.
    /// Default `"retry after"`.
    pub defer_text: String,
    /// How a crash is said: `"the worker is shutting down (interrupt or signal)"`.
    pub crash_text: String,
    /// How a person resolves a held operation, e.g.
    /// `"IdempotentJob.resolve / rake idempotent_job:resolve"`.
    pub resolve_text: String,
    /// Put before a name in texts: `":"` in Ruby (`:done`), `""` elsewhere.
    pub name_prefix: String,
    /// Put before an error's class name ([`crate::error::Error::class_name`]) in texts:
    /// `"IdempotentJob::"` in Ruby, `"idempotent_job."` in Python. Default `""`.
    /// (Fields may be added: build with `..DoorWords::default()`.)
    pub error_namespace: String,
}

impl Default for DoorWords {
    fn default() -> Self {
        DoorWords {
            id_label: "delivery".into(),
            defer_text: "retry after".into(),
            crash_text: "the worker is shutting down (interrupt or signal)".into(),
            resolve_text: "idempotent_job.resolve".into(),
            name_prefix: String::new(),
            error_namespace: String::new(),
        }
    }
}

/// What happened, with what the event and the log line need.
#[derive(Debug, Clone, PartialEq)]
pub enum NoteKind {
    /// Event `claimed` (`kind`: first, retry or takeover; `duration`: the claim's
    /// round trip in seconds). No log line.
    Claimed {
        /// First, retry or takeover.
        kind: ClaimKind,
        /// The claim's round trip, in seconds.
        duration: f64,
    },
    /// Event `taken_over`: a stale claim was taken over. No log line.
    TakenOver,
    /// Info: claimed again after the last holder's body raised.
    RetryClaimed,
    /// Event `mismatch` (`refused`); a warning, or an error when refused.
    Mismatch {
        /// The delivery was refused (`on_mismatch: raise`), not only reported.
        refused: bool,
    },
    /// Event `deferred` (`delay`, `holder_jid`); info: in progress under the holder.
    Deferred {
        /// Seconds until the delivery comes back ([`super::deferral_delay`]: soon at
        /// first, doubling, never past the lease's end plus the defer margin).
        delay: f64,
        /// The holder's delivery id, if it gave one.
        holder: Option<String>,
        /// Seconds left of the holder's lease.
        lease_remaining: f64,
        /// This deferral's number (1 for the first).
        deferral: u32,
    },
    /// Event `skipped` (`decision`, `duplicates`; with a result asked to be stored also
    /// `result_state`, and `replayed: true` when it was stored and so replayed);
    /// info: a duplicate skipped. `replay`: the state of the
    /// result the first run's completion was asked to store (V7), `None` when it was
    /// not asked to.
    Skipped {
        /// What the claim found: completed, held, given up.
        decision: Decision,
        /// The record's count of duplicate deliveries so far.
        duplicates: i32,
        /// See above.
        replay: Option<ResultState>,
    },
    /// Info: in progress under the holder; waiting up to `seconds` for its claim to
    /// end (`wait:`, [`crate::protocol::DeliveryRequest::wait_seconds`]). No event.
    Waiting {
        /// The holder's delivery id, if it gave one.
        holder: Option<String>,
        /// The longest wait, in seconds.
        seconds: f64,
    },
    /// Event `lookup` (`answer`); info: what the lookup answered.
    LookupAnswered {
        /// How the lookup is named in texts: the job's `lookup` option, else `"lookup"`.
        label: String,
        /// `"done"`, `"not_done"` or `"unknown"`.
        answer: &'static str,
    },
    /// Error: the lookup failed; not run, the claim stays stale.
    LookupFailed {
        /// The lookup's failure, as text.
        error: String,
    },
    /// Error: a failed lookup's claim could not be expired; its lease ends by itself.
    ExpireFailed {
        /// Why the expiry failed, as text.
        error: String,
    },
    /// Warning: the lookup says done: marked completed, not run.
    LookupDone {
        /// How the lookup is named in texts (as in `LookupAnswered`).
        label: String,
    },
    /// Warning: the lookup says not done: running it.
    LookupNotDone {
        /// How the lookup is named in texts (as in `LookupAnswered`).
        label: String,
    },
    /// Event `held`; warning: stale, held for a person. `lookup`: the lookup's label
    /// when one was asked and did not know; `budget`: why, when the reclaim budget
    /// (`max_takeovers`) held it rather than the stale policy (the text also stored in
    /// the record's `last_error`).
    Held {
        /// The lookup's label, when one was asked and did not know.
        lookup: Option<String>,
        /// Why the reclaim budget held it, when it did (event detail `reason`).
        budget: Option<String>,
    },
    /// Event `given_up`; warning: stale, given up.
    GivenUp {
        /// The lookup's label, when one was asked and did not know.
        lookup: Option<String>,
    },
    /// Warning: stale, running it again (a possible duplicate).
    Reclaimed {
        /// The lookup's label, when one was asked and did not know.
        lookup: Option<String>,
    },
    /// Event `completed` (`duration`: the body's run in seconds; `result_state`: what
    /// became of the result `store_result` asked to keep, or null). No log line.
    Completed {
        /// The body's run, in seconds.
        duration: f64,
        /// What became of the result `store_result` asked to keep; `None` when not asked.
        result_state: Option<ResultState>,
    },
    /// Event `result_not_stored` (`result_state`, `reason`); a warning (`reason`, the
    /// core's text: [`crate::record::PreparedResult::warning`]). The completion stands.
    ResultNotStored {
        /// Why not stored: too large or unencodable.
        state: ResultState,
        /// The core's text saying so: the log line.
        reason: String,
    },
    /// Event `lost_claim` (`during`: `"completion"` or `"heartbeat"`); error line.
    LostClaim {
        /// `"completion"` or `"heartbeat"`.
        during: &'static str,
        /// The completion's error text (`None` from the heartbeat).
        error: Option<String>,
    },
    /// Error: the completion could not be recorded after `attempts` attempts; the last
    /// error's class ([`crate::error::Error::class_name`]) and text.
    CompletionGivenUp {
        /// Completion attempts made.
        attempts: u32,
        /// The last error's text.
        error: String,
        /// The last error's class name.
        error_class: &'static str,
    },
    /// Event `released` (`error`: the body's error class).
    Released {
        /// The class name of the body's error, as the binding gave it.
        error_class: String,
    },
    /// Error: the release could not be written; the claim stays until its lease ends.
    /// The error's class ([`crate::error::Error::class_name`]) and text.
    ReleaseFailed {
        /// The release's error text.
        error: String,
        /// The release's error class name.
        error_class: &'static str,
    },
    /// Warning: a crash; the claim is kept until its lease ends.
    Kept,
    /// Warning: the body ran longer than max_run; the lease was no longer renewed.
    MaxRunReached,
}

/// One thing the protocol tells the binding.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    /// The claim's attempt for a claim's note; `None` for a delivery's.
    pub attempt: Option<i32>,
    /// What happened, with its event's details and log line's parts.
    pub kind: NoteKind,
}

/// The notes of one delivery, in order.
pub type Notes = Vec<Note>;

/// `ChargeOrderJob operation "42" (jid abc)`.
pub(crate) fn describe(delivery: &DeliveryRequest, id_label: &str) -> String {
    format!(
        "{} operation {:?} ({id_label} {})",
        delivery.job_type,
        delivery.operation_key,
        delivery.delivery_id.as_deref().unwrap_or("")
    )
}

/// `ChargeOrderJob operation "42" (jid abc, attempt 2)`.
pub(crate) fn describe_claim(claim: &ClaimInfo, id_label: &str) -> String {
    format!(
        "{} operation {:?} ({id_label} {}, attempt {})",
        claim.job_type,
        claim.operation_key,
        claim.delivery_id.as_deref().unwrap_or(""),
        claim.attempt
    )
}

impl Note {
    pub(crate) fn claim(claim: &ClaimInfo, kind: NoteKind) -> Note {
        Note {
            attempt: Some(claim.attempt),
            kind,
        }
    }

    pub(crate) fn delivery(kind: NoteKind) -> Note {
        Note {
            attempt: None,
            kind,
        }
    }

    /// The event's name in the events table, or `None` for a log line only.
    pub fn event(&self) -> Option<&'static str> {
        Some(match &self.kind {
            NoteKind::Claimed { .. } => "claimed",
            NoteKind::TakenOver => "taken_over",
            NoteKind::Mismatch { .. } => "mismatch",
            NoteKind::Deferred { .. } => "deferred",
            NoteKind::Skipped { .. } => "skipped",
            NoteKind::LookupAnswered { .. } => "lookup",
            NoteKind::Held { .. } => "held",
            NoteKind::GivenUp { .. } => "given_up",
            NoteKind::Completed { .. } => "completed",
            NoteKind::ResultNotStored { .. } => "result_not_stored",
            NoteKind::LostClaim { .. } => "lost_claim",
            NoteKind::Released { .. } => "released",
            _ => return None,
        })
    }

    /// The event's own details (after its subject), in order.
    pub fn details(&self) -> Vec<(&'static str, Detail)> {
        match &self.kind {
            NoteKind::Claimed { kind, duration } => vec![
                ("kind", Detail::Name(kind.as_str())),
                ("duration", Detail::Float(*duration)),
            ],
            NoteKind::Mismatch { refused } => vec![("refused", Detail::Bool(*refused))],
            NoteKind::Deferred { delay, holder, .. } => vec![
                ("delay", Detail::Float(*delay)),
                (
                    "holder_jid",
                    holder.clone().map_or(Detail::Null, Detail::Text),
                ),
            ],
            NoteKind::Skipped {
                decision,
                duplicates,
                replay,
            } => {
                let mut details = vec![
                    ("decision", Detail::Name(decision.as_str())),
                    ("duplicates", Detail::Int(i64::from(*duplicates))),
                ];
                if let Some(state) = replay {
                    if *state == ResultState::Stored {
                        details.push(("replayed", Detail::Bool(true)));
                    }
                    details.push(("result_state", Detail::Name(state.as_str())));
                }
                details
            }
            NoteKind::LookupAnswered { answer, .. } => vec![("answer", Detail::Name(answer))],
            NoteKind::Completed {
                duration,
                result_state,
            } => vec![
                ("duration", Detail::Float(*duration)),
                (
                    "result_state",
                    result_state.map_or(Detail::Null, |s| Detail::Name(s.as_str())),
                ),
            ],
            NoteKind::ResultNotStored { state, reason } => vec![
                ("result_state", Detail::Name(state.as_str())),
                ("reason", Detail::Text(reason.clone())),
            ],
            NoteKind::LostClaim { during, .. } => vec![("during", Detail::Name(during))],
            NoteKind::Released { error_class } => {
                vec![("error", Detail::Text(error_class.clone()))]
            }
            NoteKind::Held {
                budget: Some(reason),
                ..
            } => vec![("reason", Detail::Text(reason.clone()))],
            _ => Vec::new(),
        }
    }

    /// The log line's level, or `None` for an event only.
    pub fn level(&self) -> Option<Level> {
        Some(match &self.kind {
            NoteKind::Claimed { .. }
            | NoteKind::TakenOver
            | NoteKind::Completed { .. }
            | NoteKind::Released { .. } => return None,
            NoteKind::RetryClaimed
            | NoteKind::Deferred { .. }
            | NoteKind::Skipped { .. }
            | NoteKind::Waiting { .. }
            | NoteKind::LookupAnswered { .. } => Level::Info,
            NoteKind::Mismatch { refused: true }
            | NoteKind::LookupFailed { .. }
            | NoteKind::ExpireFailed { .. }
            | NoteKind::LostClaim { .. }
            | NoteKind::CompletionGivenUp { .. }
            | NoteKind::ReleaseFailed { .. } => Level::Error,
            _ => Level::Warn,
        })
    }

    /// The log line's text (without the gem's prefix), or `None` for an event only.
    /// `delivery` is the request the notes were made for; `words` the door's.
    pub fn text(&self, delivery: &DeliveryRequest, words: &DoorWords) -> Option<String> {
        let label = words.id_label.as_str();
        let claim = || {
            format!(
                "{} operation {:?} ({label} {}, attempt {})",
                delivery.job_type,
                delivery.operation_key,
                delivery.delivery_id.as_deref().unwrap_or(""),
                self.attempt.unwrap_or(0)
            )
        };
        let why = |lookup: &Option<String>| match lookup {
            Some(label) => format!("{label} does not know"),
            None => "its holder's lease ran out".to_string(),
        };
        let p = words.name_prefix.as_str();
        Some(match &self.kind {
            NoteKind::Claimed { .. }
            | NoteKind::TakenOver
            | NoteKind::Completed { .. }
            | NoteKind::Released { .. } => return None,
            NoteKind::RetryClaimed => format!("claimed {} again after a failure", claim()),
            NoteKind::Mismatch { refused } => {
                let text = format!(
                    "{} was delivered with arguments that differ from those of its claim \
                     (same operation key, different payload)",
                    describe(delivery, label)
                );
                if *refused {
                    format!("{text}; delivery refused")
                } else {
                    text
                }
            }
            NoteKind::Deferred {
                delay,
                holder,
                lease_remaining,
                deferral,
            } => format!(
                "{} is in progress under {label} {}; {} {delay:.1} s (deferral {deferral}; its \
                 lease ends in {lease_remaining:.1} s)",
                describe(delivery, label),
                holder.as_deref().unwrap_or(""),
                words.defer_text
            ),
            NoteKind::Skipped {
                decision,
                duplicates,
                replay,
            } => {
                let state = match decision {
                    Decision::Completed => "already completed",
                    Decision::Held => "held for a person",
                    Decision::GivenUp => "given up",
                    _ => "not claimable by this payload",
                };
                let replayed = match replay {
                    None => String::new(),
                    Some(ResultState::Stored) => "; replayed: true (its stored result)".into(),
                    Some(other) => {
                        // No value to replay: every binding's `replayed` is false
                        // ([`super::Outcome::replayed`]).
                        format!(
                            "; no value replayed (result {}, not stored)",
                            other.as_str()
                        )
                    }
                };
                format!(
                    "{} is {state}; duplicate delivery skipped ({duplicates} so far){replayed}",
                    describe(delivery, label)
                )
            }
            NoteKind::Waiting { holder, seconds } => format!(
                "{} is in progress under {label} {}; waiting up to {seconds:?} s for it",
                describe(delivery, label),
                holder.as_deref().unwrap_or("")
            ),
            NoteKind::ResultNotStored { reason, .. } => reason.clone(),
            NoteKind::LookupAnswered {
                label: lookup,
                answer,
            } => {
                format!("{lookup} of {} answered {p}{answer}", claim())
            }
            NoteKind::LookupFailed { error } => format!(
                "lookup of {} failed ({error}); not run, the claim stays stale for the next \
                 delivery",
                claim()
            ),
            NoteKind::ExpireFailed { error } => format!(
                "could not end the lease of {} ({error}); it ends by itself",
                claim()
            ),
            NoteKind::LookupDone { label: lookup } => format!(
                "took over the stale claim of {}; {lookup} says it is done: marked completed, \
                 not run",
                claim()
            ),
            NoteKind::LookupNotDone { label: lookup } => format!(
                "took over the stale claim of {}; {lookup} says it is not done: running it",
                claim()
            ),
            NoteKind::Held { lookup, budget } => format!(
                "{} is stale ({}): held for a person{} ({})",
                claim(),
                why(lookup),
                budget
                    .as_ref()
                    .map(|reason| format!(": {reason}"))
                    .unwrap_or_default(),
                words.resolve_text
            ),
            NoteKind::GivenUp { lookup } => {
                format!("{} is stale ({}): given up, not run", claim(), why(lookup))
            }
            NoteKind::Reclaimed { lookup } => format!(
                "took over the stale claim of {} ({}): running it again (if the holder had \
                 done the effect, this is a duplicate)",
                claim(),
                why(lookup)
            ),
            NoteKind::LostClaim {
                during: "heartbeat",
                ..
            } => format!(
                "lost the claim of {} while it ran: a renewal found it taken over",
                claim()
            ),
            NoteKind::LostClaim { error, .. } => format!(
                "{} ran, but lost its claim: {}",
                claim(),
                error.as_deref().unwrap_or("")
            ),
            NoteKind::CompletionGivenUp {
                attempts,
                error,
                error_class,
            } => format!(
                "{} ran, but its completion could not be recorded after {attempts} attempts \
                 ({}{error_class}: {error}); the record stays claimed until its lease ends, \
                 after which a redelivery would run it again",
                claim(),
                words.error_namespace
            ),
            NoteKind::ReleaseFailed { error, error_class } => format!(
                "could not release the claim of {} ({}{error_class}: {error}); it stays \
                 claimed until its lease ends",
                claim(),
                words.error_namespace
            ),
            NoteKind::Kept => format!(
                "{}: the claim of {} is kept until its lease ends",
                words.crash_text,
                claim()
            ),
            NoteKind::MaxRunReached => format!(
                "{} ran longer than its max_run; its lease was no longer renewed",
                claim()
            ),
        })
    }
}
