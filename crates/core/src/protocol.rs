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
mod note;
mod perform;

pub use crate::record::ClaimKind;
/// The job options the decision table decides by, re-exported from it: one type for the
/// running protocol and the model check.
pub use crate::transitions::{OnMismatch, OnStale};
pub use channel::{Channel, Direct};
pub use note::{Detail, DoorWords, Level, Note, NoteKind, Notes};
pub use perform::{Body, Host, Performed};

use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::config::MAX_LEASE_SECONDS;
use crate::conn::Interrupt;
use crate::error::{Error, Result};
use crate::fenced::Fenced;
use crate::heartbeat::{Heartbeat, HeartbeatReader, HeartbeatReport};
use crate::record::{self, ClaimRequest, PreparedResult, ResultInput, ResultState};
use crate::transitions::{self, Answer, Next, Rules};

/// Seconds before a deferred delivery's first return ([`deferral_delay`]).
pub const DEFERRAL_FIRST_DELAY: f64 = 1.0;
/// Growth of the deferral's delay per deferral already had ([`deferral_delay`]).
pub const DEFERRAL_FACTOR: f64 = 2.0;
/// Seconds waited before each new attempt of a failed completion outside a
/// transaction: 7 attempts in all (each bounded by the deadline), 15.3 s of pauses,
/// longer than a PostgreSQL restart takes.
pub const COMPLETION_RETRY_DELAYS: [f64; 6] = [0.05, 0.25, 1.0, 2.0, 4.0, 8.0];
/// Longest error text stored in `last_error` (a release's or a failed lookup's), in
/// characters.
pub const ERROR_TEXT_LIMIT: usize = 1000;
/// Shortest lease accepted, in seconds: below it a heartbeat cannot renew in time.
pub const MIN_LEASE_SECONDS: f64 = crate::options::MIN_LEASE_SECONDS;

/// One job type's resolved protocol options (the binding resolves its language's
/// declaration and the configured defaults into this, once per job class).
///
/// Names and defaults follow the Ruby options (`lease`, `on_stale`, `on_mismatch`,
/// `lookup`, `heartbeat`, `max_run`, `lock_timeout`, the `defer_margin` setting) and
/// `store_result` of the stored-results work; the defaults are read from the core's
/// options table ([`crate::options::JOB_OPTIONS`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    /// Lease in seconds ([`MIN_LEASE_SECONDS`]..=[`MAX_LEASE_SECONDS`]). Default 300.
    pub lease_seconds: f64,
    /// The stale policy. Default [`OnStale::Reclaim`].
    pub on_stale: OnStale,
    /// The mismatch rule. Default [`OnMismatch::Log`].
    pub on_mismatch: OnMismatch,
    /// `Some(label)` when a lookup is declared: a takeover then answers
    /// [`Step::AskLookup`], and `label` names it in log lines and errors (e.g.
    /// `"lookup #find_charge"`, `"lookup"`). `None`: no lookup. Default `None`.
    pub lookup: Option<String>,
    /// Renew the lease while the body runs (outside a transaction). Default true.
    pub heartbeat: bool,
    /// Seconds after which the heartbeat stops renewing, so a hung body loses its
    /// claim. Default 3600.
    pub max_run_seconds: f64,
    /// Seconds a transactional claim waits for another delivery's transaction
    /// (`lock_timeout`). Default 5. Unused by [`Direct`].
    pub lock_timeout_seconds: f64,
    /// Seconds added past the holder's lease end to the deferral's delay
    /// ([`deferral_delay`]). Default 1.
    pub defer_margin_seconds: f64,
    /// Store the body's value with the completion ([`Protocol::complete_prepared`]):
    /// a repeat of the completed operation replays it ([`Outcome::result_json`]).
    /// Default false.
    pub store_result: bool,
    /// The reclaim budget: `Some(n)` once `n` stale takeovers of one operation have
    /// been made, the next one is held for a person (after its lookup, if one is
    /// declared and does not know) whatever [`JobOptions::on_stale`] says. `None`
    /// (the default): no budget.
    pub max_takeovers: Option<i32>,
}

/// Seconds the deferral adds past the holder's lease end when no `defer_margin`
/// setting says otherwise.
pub const DEFAULT_DEFER_MARGIN_SECONDS: f64 = 1.0;

/// The default of the job option `name` in the core's options table
/// ([`crate::options::JOB_OPTIONS`]), the one place defaults are stated.
fn table_default(name: &str) -> crate::options::Default {
    crate::options::find(name)
        .map(|o| o.default)
        .unwrap_or(crate::options::Default::None)
}

fn seconds_default(name: &str) -> f64 {
    match table_default(name) {
        crate::options::Default::Seconds(s) => s,
        other => unreachable!("the options table's {name} default is {other:?}, not seconds"),
    }
}

fn boolean_default(name: &str) -> bool {
    match table_default(name) {
        crate::options::Default::Boolean(b) => b,
        other => unreachable!("the options table's {name} default is {other:?}, not a boolean"),
    }
}

fn choice_default(name: &str) -> &'static str {
    match table_default(name) {
        crate::options::Default::Choice(c) => c,
        other => unreachable!("the options table's {name} default is {other:?}, not a choice"),
    }
}

/// Every default read from the core's options table ([`crate::options::JOB_OPTIONS`]);
/// `defer_margin_seconds` is [`DEFAULT_DEFER_MARGIN_SECONDS`] (a setting, not a job
/// option).
impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            lease_seconds: seconds_default("lease"),
            on_stale: OnStale::parse("", choice_default("on_stale")).unwrap_or_default(),
            on_mismatch: OnMismatch::parse("", choice_default("on_mismatch")).unwrap_or_default(),
            lookup: None,
            heartbeat: boolean_default("heartbeat"),
            max_run_seconds: seconds_default("max_run"),
            lock_timeout_seconds: seconds_default("lock_timeout"),
            defer_margin_seconds: DEFAULT_DEFER_MARGIN_SECONDS,
            store_result: boolean_default("store_result"),
            max_takeovers: None,
        }
    }
}

impl JobOptions {
    /// Checks every value.
    ///
    /// Errors: [`Error::Config`] naming `job` and the option: a lease outside
    /// [`MIN_LEASE_SECONDS`]..=[`MAX_LEASE_SECONDS`], a max_run, lock timeout or defer
    /// margin that is not a finite number of seconds in range, an empty lookup label.
    pub fn validate(&self, job: &str) -> Result<()> {
        let bad = |what: &str, value: f64, rule: &str| {
            Err(Error::Config(format!(
                "{job}: {what} must be {rule}, got {value}"
            )))
        };
        if !(self.lease_seconds >= MIN_LEASE_SECONDS && self.lease_seconds <= MAX_LEASE_SECONDS) {
            return bad(
                "lease",
                self.lease_seconds,
                &format!(
                    "at least {MIN_LEASE_SECONDS} s (a shorter lease cannot be renewed in time) \
                     and at most {MAX_LEASE_SECONDS} s"
                ),
            );
        }
        if !(self.max_run_seconds > 0.0 && self.max_run_seconds <= MAX_LEASE_SECONDS) {
            return bad(
                "max_run",
                self.max_run_seconds,
                &format!("a positive number of seconds up to {MAX_LEASE_SECONDS}"),
            );
        }
        if !(self.lock_timeout_seconds > 0.0
            && self.lock_timeout_seconds <= crate::config::MAX_PG_TIMEOUT_SECONDS)
        {
            return bad(
                "lock_timeout",
                self.lock_timeout_seconds,
                &format!(
                    "a positive number of seconds up to {}",
                    crate::config::MAX_PG_TIMEOUT_SECONDS
                ),
            );
        }
        if !(self.defer_margin_seconds >= 0.0 && self.defer_margin_seconds <= MAX_LEASE_SECONDS) {
            return bad(
                "defer_margin",
                self.defer_margin_seconds,
                &format!("a number of seconds from 0 to {MAX_LEASE_SECONDS}"),
            );
        }
        if self.lookup.as_deref() == Some("") {
            return Err(Error::Config(format!(
                "{job}: the lookup's label must not be empty"
            )));
        }
        Ok(())
    }
}

/// One delivery of one operation, as the binding's door sees it.
#[derive(Debug, Clone, Default)]
pub struct DeliveryRequest {
    /// The job type (idempotency scope), e.g. `"ChargeOrderJob"`.
    pub job_type: String,
    /// The canonical operation key, e.g. `"42"`.
    pub operation_key: String,
    /// The delivery's id in its queue (Sidekiq's jid, ActiveJob's job_id, Celery's task
    /// id, an SQS message id), stored as the record's last claiming delivery.
    pub delivery_id: Option<String>,
    /// The job class, queue and arguments (JSON text), stored for a rerun.
    pub job_class: Option<String>,
    pub queue: Option<String>,
    pub args_json: Option<String>,
    /// Digest of the delivery's canonical payload (mismatch detection); `None`: not
    /// compared.
    pub args_digest: Option<String>,
    /// The door's facts about this delivery (a JSON object text) for the repeats
    /// report, or `None`.
    pub facts_json: Option<String>,
    /// Deferrals this delivery already had (each [`Step::InProgress`] the door acted
    /// on adds one): the deferral's delay doubles with each.
    pub deferrals: u32,
    /// Seconds to wait, when the claim is live, for it to end before deciding again:
    /// [`Protocol::begin`] then answers [`Step::InProgress`] with
    /// [`Outcome::wait_seconds`] and the binding calls [`Protocol::wait`] (a completion
    /// then replays, a release may run); `None`: no wait (the delivery is deferred at
    /// once). Only on a channel that can wait ([`Channel::can_wait`]: not a transaction).
    pub wait_seconds: Option<f64>,
    /// When the work before the body must have ended, whatever the database does (a
    /// call with `wait`: [`DeliveryRequest::bound_wait`]); `None`: each database call's
    /// own deadline only. [`Protocol::begin`] and [`Protocol::wait`] cut every
    /// database call at it (the deadline's [`crate::error::Error::Timeout`]).
    pub wait_until: Option<Instant>,
}

/// The reason a hold by the reclaim budget stores in `last_error` and tells in the
/// `held` event and log line: `takeovers` stale takeovers of the operation, more than
/// `max_takeovers`. Begins with [`crate::sql::RECLAIM_BUDGET_SPENT`] (what `/metrics`
/// counts such holds by).
pub fn reclaim_budget_reason(takeovers: i32, max_takeovers: i32) -> String {
    let noun = if takeovers == 1 {
        "takeover"
    } else {
        "takeovers"
    };
    format!(
        concat!(
            crate::sql::reclaim_budget_spent!(),
            ": {} stale {} of this operation, max_takeovers {}"
        ),
        takeovers, noun, max_takeovers
    )
}

/// Seconds a call with `wait: N` may take beyond N before its body starts or it
/// returns or raises ([`DeliveryRequest::bound_wait`]): the claim, the wait and the
/// decision after it all end within N + this, even with PostgreSQL refusing or never
/// answering.
pub const WAIT_MARGIN_SECONDS: f64 = 0.5;

impl DeliveryRequest {
    /// Starts the bound of a call with `wait_seconds` (call it when the call starts):
    /// `wait_until` = now + `wait_seconds` + [`WAIT_MARGIN_SECONDS`]; no bound without
    /// a wait.
    pub fn bound_wait(&mut self) {
        self.wait_until = self
            .wait_seconds
            .map(|w| Instant::now() + Duration::from_secs_f64(w.max(0.0) + WAIT_MARGIN_SECONDS));
    }

    /// The claim statement's request for this delivery under `options`.
    pub fn claim_request(&self, options: &JobOptions) -> ClaimRequest {
        ClaimRequest {
            job_type: self.job_type.clone(),
            operation_key: self.operation_key.clone(),
            delivery_id: self.delivery_id.clone(),
            lease_seconds: options.lease_seconds,
            args_digest: self.args_digest.clone(),
            job_class: self.job_class.clone(),
            queue: self.queue.clone(),
            args_json: self.args_json.clone(),
            refuse_mismatch: options.on_mismatch == OnMismatch::Raise,
            facts_json: self.facts_json.clone(),
            returning: self.deferrals > 0,
        }
    }
}

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
    /// claim): not run. [`Protocol::begin`] raises [`Error::PayloadMismatch`] first.
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
    pub job_type: String,
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
    info: ClaimInfo,
    /// The lease renewal while the body runs (started with [`Step::Run`] when the
    /// options and the channel have one).
    heartbeat: Option<Heartbeat>,
    /// When [`Step::Run`] was handed out: the body's duration counts from here.
    started: Instant,
    /// Stale takeovers of the operation, this claim included when it is one (the
    /// record's `takeovers`): what the reclaim budget (`max_takeovers`) is checked on.
    takeovers: i32,
}

impl Claim {
    fn new(info: ClaimInfo, takeovers: i32) -> Claim {
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
}

impl Outcome {
    fn of(decision: Decision) -> Outcome {
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
        }
    }

    /// Whether the body ran (and returned).
    pub fn ran(&self) -> bool {
        self.decision == Decision::Ran
    }

    /// Whether this is a replay: a repeat of a completed operation whose completion
    /// was asked to store its result ([`Outcome::result_state`] says whether it was
    /// stored; [`Outcome::result_json`] holds it when it was).
    pub fn replayed(&self) -> bool {
        self.decision == Decision::Completed && self.result_state.is_some()
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
    Invalid { answer: String },
    /// The lookup raised (or could not be called); `error` is `"Class: message"`.
    Raised { error: String },
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

/// The deferral's delay: seconds until a delivery that met a live claim comes back.
/// Soon at first ([`DEFERRAL_FIRST_DELAY`]), doubling with each deferral the delivery
/// already had, never later than the holder's lease end plus `margin_seconds`, so it
/// is there when a dead holder's lease runs out. Coming back early is safe: the claim
/// statement decides again.
pub fn deferral_delay(lease_remaining: f64, deferrals: u32, margin_seconds: f64) -> f64 {
    let latest = lease_remaining.max(0.0) + margin_seconds;
    let backoff = DEFERRAL_FIRST_DELAY * DEFERRAL_FACTOR.powi(deferrals.min(30) as i32);
    backoff.min(latest)
}

/// Longest delay, in seconds, before a delivery whose claim could not be made
/// (PostgreSQL unreachable or a retryable error) comes back ([`unreachable_delay`]).
pub const UNREACHABLE_MAX_DELAY: f64 = 60.0;

/// Seconds until a delivery comes back after a retryable error before its body started
/// (the claim could not be made or answered): the deferral's back-off
/// ([`DEFERRAL_FIRST_DELAY`] doubling per such failure already had, `failures` counts
/// them before this one) capped at [`UNREACHABLE_MAX_DELAY`]. For a door whose queue
/// would otherwise drop the delivery (Celery acknowledges a failed task's message).
pub fn unreachable_delay(failures: u32) -> f64 {
    deferral_delay(UNREACHABLE_MAX_DELAY, failures, 0.0)
}

/// Seconds between two error log lines of a door for claims failing with the same
/// cause ([`claim_error_report`]): a database down or misconfigured fails every
/// delivery, and one line per interval names the cause without a line per message.
pub const CLAIM_ERROR_LOG_INTERVAL: f64 = 60.0;

/// Whether a door logs, now, the error line for a claim failing with `cause` (a
/// short text naming the cause, e.g. the error's class and SQLSTATE): `Some(n)` the
/// first time and then at most once per [`CLAIM_ERROR_LOG_INTERVAL`] per process,
/// `n` counting the failures of that cause not logged since the last line; `None`
/// otherwise (the door logs that delivery at debug level only).
pub fn claim_error_report(cause: &str) -> Option<u64> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<String, (Instant, u64)>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let now = Instant::now();
    let interval = Duration::from_secs_f64(CLAIM_ERROR_LOG_INTERVAL);
    match seen.get_mut(cause) {
        Some((last, skipped)) if now.duration_since(*last) < interval => {
            *skipped += 1;
            None
        }
        Some((last, skipped)) => {
            let n = *skipped;
            *last = now;
            *skipped = 0;
            Some(n)
        }
        None => {
            seen.insert(cause.to_string(), (now, 0));
            Some(0)
        }
    }
}

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

    /// Claims (one statement) and decides what the delivery does.
    ///
    /// Notes: `claimed` (with the claim's duration) and `taken_over` for a won claim; a
    /// retry's info line; `mismatch` for a payload mismatch; `deferred` for a live
    /// claim; `skipped` for a duplicate; the stale policy's notes after a takeover
    /// without lookup.
    ///
    /// Errors: [`Error::Config`] for a bad request (empty or oversized key…);
    /// [`Error::PayloadMismatch`] under [`OnMismatch::Raise`] when the payload differs
    /// and this delivery did not win the claim; [`Error::LostClaim`] and connection or
    /// database errors from a hold or give-up after a takeover; connection, database,
    /// timeout and lock-timeout errors from the claim (nothing ran); [`Error::Interrupted`].
    pub fn begin(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        delivery: &DeliveryRequest,
        notes: &mut Notes,
    ) -> Result<Step> {
        interrupt.end_by(delivery.wait_until);
        let request = delivery.claim_request(&self.options);
        let started = Instant::now();
        let decided = channel.claim(interrupt, &request, self.options.lock_timeout_seconds)?;
        let duration = started.elapsed().as_secs_f64();
        self.decide(channel, interrupt, delivery, decided, duration, true, notes)
    }

    /// After [`Protocol::begin`] answered [`Step::InProgress`] with
    /// [`Outcome::wait_seconds`] (the binding told its notes meanwhile): waits for the
    /// live claim to end ([`Channel::wait`], at most that long, no pooled connection
    /// held), then decides again as `begin` does: a completion replays, a release may
    /// run, a claim still live is deferred (no second wait).
    ///
    /// Notes and errors: as [`Protocol::begin`].
    pub fn wait(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        delivery: &DeliveryRequest,
        notes: &mut Notes,
    ) -> Result<Step> {
        interrupt.end_by(delivery.wait_until);
        let seconds = delivery.wait_seconds.unwrap_or(0.0);
        let request = delivery.claim_request(&self.options);
        let started = Instant::now();
        let Some(decided) = channel.wait(interrupt, &request, seconds)? else {
            return Err(Error::Config(format!(
                "{}: this channel cannot wait for a live claim (wait: is not for transactions)",
                delivery.job_type
            )));
        };
        let duration = started.elapsed().as_secs_f64();
        self.decide(
            channel, interrupt, delivery, decided, duration, false, notes,
        )
    }

    /// What the delivery does after the claim statement's `decided` (`duration`: the
    /// claim's seconds); `may_wait`: a live claim answers a wait when the delivery asks
    /// for one and the channel can.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        delivery: &DeliveryRequest,
        decided: record::ClaimReply,
        duration: f64,
        may_wait: bool,
        notes: &mut Notes,
    ) -> Result<Step> {
        let takeovers = match decided.outcome {
            record::ClaimAnswer::Claimed { takeovers, .. } => takeovers,
            _ => 0,
        };
        let next = transitions::next(
            decided.outcome.verdict(),
            decided.mismatch,
            self.rules(takeovers),
        );
        if decided.mismatch || next == Next::RefuseMismatch {
            let refused = next == Next::RefuseMismatch;
            notes.push(Note::delivery(NoteKind::Mismatch { refused }));
            if refused {
                return Err(self.mismatch_refused(delivery));
            }
        }
        let duplicate = |decision: Decision, duplicates: i32, notes: &mut Notes| {
            notes.push(Note::delivery(NoteKind::Skipped {
                decision,
                duplicates,
                replay: None,
            }));
            let mut outcome = Outcome::of(decision);
            outcome.duplicates = Some(duplicates);
            Step::Skip(outcome)
        };
        let answered = decided.outcome.name();
        Ok(match (next, decided.outcome) {
            (
                Next::Run | Next::AskLookup | Next::Hold | Next::GiveUp,
                record::ClaimAnswer::Claimed {
                    token,
                    attempt,
                    kind,
                    takeovers,
                },
            ) => {
                let info = ClaimInfo {
                    job_type: delivery.job_type.clone(),
                    operation_key: delivery.operation_key.clone(),
                    delivery_id: delivery.delivery_id.clone(),
                    token,
                    attempt,
                    kind,
                };
                notes.push(Note::claim(&info, NoteKind::Claimed { kind, duration }));
                let claim = Claim::new(info, takeovers);
                match kind {
                    ClaimKind::First => {}
                    ClaimKind::Retry => {
                        notes.push(Note::claim(&claim.info, NoteKind::RetryClaimed))
                    }
                    ClaimKind::Takeover => {
                        notes.push(Note::claim(&claim.info, NoteKind::TakenOver))
                    }
                }
                match next {
                    Next::AskLookup => Step::AskLookup(claim),
                    Next::Run if kind != ClaimKind::Takeover => self.run(channel, claim),
                    // A takeover without a lookup: the stale policy's step.
                    next => self.stale_step(channel, interrupt, claim, next, notes)?,
                }
            }
            (
                Next::Defer,
                record::ClaimAnswer::InProgress {
                    holder_delivery_id,
                    lease_remaining,
                    duplicates,
                    ..
                },
            ) if may_wait && delivery.wait_seconds.is_some() && channel.can_wait() => {
                let seconds = delivery.wait_seconds.unwrap_or(0.0);
                notes.push(Note::delivery(NoteKind::Waiting {
                    holder: holder_delivery_id.clone(),
                    seconds,
                }));
                let mut outcome = Outcome::of(Decision::InProgress);
                outcome.duplicates = Some(duplicates);
                outcome.lease_remaining = Some(lease_remaining);
                outcome.holder = holder_delivery_id;
                outcome.wait_seconds = Some(seconds);
                Step::InProgress(outcome)
            }
            (
                Next::Defer,
                record::ClaimAnswer::InProgress {
                    holder_delivery_id,
                    lease_remaining,
                    duplicates,
                    ..
                },
            ) => {
                let delay = deferral_delay(
                    lease_remaining,
                    delivery.deferrals,
                    self.options.defer_margin_seconds,
                );
                notes.push(Note::delivery(NoteKind::Deferred {
                    delay,
                    holder: holder_delivery_id.clone(),
                    lease_remaining,
                    deferral: delivery.deferrals + 1,
                }));
                Step::InProgress(Outcome {
                    decision: Decision::InProgress,
                    duplicates: Some(duplicates),
                    retry_after: Some(delay),
                    lease_remaining: Some(lease_remaining),
                    holder: holder_delivery_id,
                    claim: None,
                    result_json: None,
                    result_state: None,
                    wait_seconds: None,
                })
            }
            (Next::Skip, record::ClaimAnswer::Completed { duplicates, replay }) => {
                // A replay: the first run's stored result (V7), when its completion was
                // asked to keep one (its state says whether it could).
                let state = replay.as_ref().map(|r| r.state);
                notes.push(Note::delivery(NoteKind::Skipped {
                    decision: Decision::Completed,
                    duplicates,
                    replay: state,
                }));
                let mut outcome = Outcome::of(Decision::Completed);
                outcome.duplicates = Some(duplicates);
                outcome.result_state = state;
                outcome.result_json = replay.and_then(|r| r.json);
                Step::Skip(outcome)
            }
            (Next::Skip, record::ClaimAnswer::Held { duplicates }) => {
                duplicate(Decision::Held, duplicates, notes)
            }
            (Next::Skip, record::ClaimAnswer::GivenUp { duplicates }) => {
                duplicate(Decision::GivenUp, duplicates, notes)
            }
            (next, _) => {
                return Err(Error::Database {
                    message: format!(
                        "{}: the claim statement answered {answered} and the decision table \
                         gives {next:?} for it, which this version of idempotent_job cannot \
                         do (nothing ran)",
                        note::describe(delivery, &self.words.id_label)
                    ),
                    sqlstate: "XX000".into(),
                })
            }
        })
    }

    /// The error of a delivery refused for its payload ([`Next::RefuseMismatch`]: it
    /// differs from the claim's and [`OnMismatch::Raise`]; this delivery did not win).
    fn mismatch_refused(&self, delivery: &DeliveryRequest) -> Error {
        Error::PayloadMismatch {
            job_type: delivery.job_type.clone(),
            operation_key: delivery.operation_key.clone(),
            message: format!(
                "{} was delivered with arguments that differ from those of its claim \
                 (same operation key, different payload); refused (on_mismatch: \
                 raise), the job was not run",
                note::describe(delivery, &self.words.id_label)
            ),
        }
    }

    /// Applies a stale claim's lookup answer: [`LookupAnswer::Done`] marks it
    /// completed (not run), [`LookupAnswer::NotDone`] runs the body,
    /// [`LookupAnswer::Unknown`] applies the stale policy. An invalid answer or a
    /// lookup that raised ends the claim's lease now (so the next delivery asks again)
    /// and fails with [`Error::Lookup`]: the body is not run.
    ///
    /// Notes: `lookup` (the answer) and an info line, or an error line for a failed
    /// lookup; the completion's warning, or the stale policy's notes.
    ///
    /// Errors: [`Error::Lookup`] as said; [`Error::LostClaim`], connection and
    /// database errors from the completion, hold or give-up; [`Error::Interrupted`].
    pub fn after_lookup(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        claim: Claim,
        answer: LookupAnswer,
        notes: &mut Notes,
    ) -> Result<Step> {
        let label = self.options.lookup.as_deref().unwrap_or("lookup");
        let p = self.words.name_prefix.as_str();
        let failure = match &answer {
            LookupAnswer::Invalid { answer } => Some(format!(
                "{label} of {{claim}} answered {answer}; expected {p}done, {p}not_done or {p}unknown"
            )),
            LookupAnswer::Raised { error } => Some(format!(
                "{label} of {{claim}} raised {error}; the job was not run, the next delivery \
                 asks again"
            )),
            _ => None,
        };
        if let Some(failure) = failure {
            let described = note::describe_claim(&claim.info, &self.words.id_label);
            let message = failure.replace("{claim}", &described);
            let cause = match &answer {
                LookupAnswer::Raised { error } => error.clone(),
                _ => message.clone(),
            };
            notes.push(Note::claim(
                &claim.info,
                NoteKind::LookupFailed {
                    error: cause.clone(),
                },
            ));
            let expired = channel.fenced(
                interrupt,
                Fenced::Expire,
                &claim.info,
                Some(limited(&format!("lookup failed: {cause}"))),
            );
            if let Err(e) = expired {
                if matches!(e, Error::Interrupted) {
                    return Err(e);
                }
                notes.push(Note::claim(
                    &claim.info,
                    NoteKind::ExpireFailed {
                        error: e.to_string(),
                    },
                ));
            }
            return Err(Error::Lookup {
                job_type: claim.info.job_type.clone(),
                operation_key: claim.info.operation_key.clone(),
                message,
            });
        }
        let answered = match answer {
            LookupAnswer::Done => "done",
            LookupAnswer::NotDone => "not_done",
            _ => "unknown",
        };
        notes.push(Note::claim(
            &claim.info,
            NoteKind::LookupAnswered {
                label: label.to_string(),
                answer: answered,
            },
        ));
        let answered = match answer {
            LookupAnswer::Done => Answer::Done,
            LookupAnswer::NotDone => Answer::NotDone,
            _ => Answer::Unknown,
        };
        match transitions::after_lookup(answered, self.stale_policy(claim.takeovers)) {
            Next::Complete => {
                channel.fenced(interrupt, Fenced::Complete, &claim.info, None)?;
                notes.push(Note::claim(
                    &claim.info,
                    NoteKind::LookupDone {
                        label: label.to_string(),
                    },
                ));
                let mut outcome = Outcome::of(Decision::Completed);
                outcome.claim = Some(claim.info.clone());
                Ok(Step::Skip(outcome))
            }
            Next::Run if answered == Answer::NotDone => {
                notes.push(Note::claim(
                    &claim.info,
                    NoteKind::LookupNotDone {
                        label: label.to_string(),
                    },
                ));
                Ok(self.run(channel, claim))
            }
            next => self.stale_step(channel, interrupt, claim, next, notes),
        }
    }

    /// Records the completion of a body that returned, after stopping its heartbeat.
    /// Outside a transaction every failure but a lost claim is retried after
    /// [`COMPLETION_RETRY_DELAYS`] (the body has run: its delivery must not fail and be
    /// retried); if every attempt fails, an error line says so and the record stays
    /// claimed until its lease ends ([`Completion::recorded`] false). Inside a
    /// transaction it is written once and any failure is returned.
    ///
    /// `result`: the body's value (JSON), stored with the completion, in the same
    /// statement, when [`JobOptions::store_result`] is on, if its JSON text is at most
    /// `max_result_bytes` long (the store's [`crate::config::Config::max_result_bytes`];
    /// a larger one is not stored: [`crate::record::prepare`]). Ignored without
    /// `store_result`. A binding that encodes the value itself prepares the result and
    /// calls [`Protocol::complete_prepared`].
    ///
    /// Notes: the heartbeat's (a claim lost while running, max_run reached);
    /// `completed` (with the body's duration); `lost_claim` and an error line; the
    /// error line of a completion given up.
    ///
    /// Errors: [`Error::LostClaim`] when another delivery took the operation over; in a
    /// transaction, any error of the statement; [`Error::Interrupted`] (a pause between
    /// attempts or an attempt was interrupted: the record stays claimed).
    pub fn complete(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        claim: Claim,
        result: Option<&serde_json::Value>,
        max_result_bytes: usize,
        notes: &mut Notes,
    ) -> Result<Completion> {
        let prepared = match result {
            Some(value) if self.options.store_result => Some(record::prepare(
                max_result_bytes,
                &claim.info.job_type,
                &claim.info.operation_key,
                ResultInput::Json(&value.to_string()),
            )),
            _ => None,
        };
        self.complete_prepared(channel, interrupt, claim, prepared, notes)
    }

    /// [`Protocol::complete`] with the result already prepared by the binding
    /// ([`crate::record::prepare`] with its configured `max_result_bytes`; `None`:
    /// nothing to store, as without `store_result`). The completion statement writes it
    /// ($4, $5): no extra round trip. A result that could not be stored (too large, not
    /// JSON) never fails the completion: a `result_not_stored` note (event and
    /// warning) says why.
    ///
    /// Notes and errors: as [`Protocol::complete`], `completed` carrying the result's
    /// state, then `result_not_stored` when it was not stored.
    pub fn complete_prepared(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        mut claim: Claim,
        result: Option<PreparedResult>,
        notes: &mut Notes,
    ) -> Result<Completion> {
        claim.stop_heartbeat(notes);
        let duration = claim.started.elapsed().as_secs_f64();
        let transactional = channel.transactional();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let written = channel.complete(interrupt, &claim.info, result.as_ref());
            match written {
                Ok(()) => {
                    notes.push(Note::claim(
                        &claim.info,
                        NoteKind::Completed {
                            duration,
                            result_state: result.as_ref().map(|r| r.state),
                        },
                    ));
                    if let Some(PreparedResult {
                        state,
                        warning: Some(reason),
                        ..
                    }) = &result
                    {
                        notes.push(Note::claim(
                            &claim.info,
                            NoteKind::ResultNotStored {
                                state: *state,
                                reason: reason.clone(),
                            },
                        ));
                    }
                    break;
                }
                Err(e @ Error::LostClaim { .. }) => {
                    notes.push(Note::claim(
                        &claim.info,
                        NoteKind::LostClaim {
                            during: "completion",
                            error: Some(e.to_string()),
                        },
                    ));
                    return Err(e);
                }
                Err(e @ Error::Interrupted) => return Err(e),
                Err(e) if transactional => return Err(e),
                Err(e) => {
                    let Some(delay) = COMPLETION_RETRY_DELAYS.get(attempts as usize - 1) else {
                        notes.push(Note::claim(
                            &claim.info,
                            NoteKind::CompletionGivenUp {
                                attempts,
                                error: e.to_string(),
                                error_class: e.class_name(),
                            },
                        ));
                        return Ok(Completion {
                            outcome: self.ran(&claim, None),
                            recorded: false,
                            attempts,
                            result_stored: false,
                        });
                    };
                    channel.pause(interrupt, Duration::from_secs_f64(*delay))?;
                }
            }
        }
        let state = result.as_ref().map(|r| r.state);
        Ok(Completion {
            outcome: self.ran(&claim, state),
            recorded: true,
            attempts,
            result_stored: state == Some(ResultState::Stored),
        })
    }

    /// Gives the claim back after the body raised (`error_class`, `message`: what it
    /// raised; stored in `last_error`, cut to [`ERROR_TEXT_LIMIT`] characters), after
    /// stopping its heartbeat, so the queue's retry claims it again at once. Never
    /// fails: a release that cannot be written leaves the claim for its lease to end
    /// (an error line says so). In a transaction nothing is written (the rollback
    /// undoes the claim).
    ///
    /// Notes: the heartbeat's; `released` (with the error class), or the error line of
    /// a release that failed.
    pub fn release(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        mut claim: Claim,
        error_class: &str,
        message: &str,
        notes: &mut Notes,
    ) {
        claim.stop_heartbeat(notes);
        if channel.transactional() {
            return;
        }
        let text = format!("{error_class}: {message}");
        match channel.fenced(
            interrupt,
            Fenced::Release,
            &claim.info,
            Some(limited(&text)),
        ) {
            Ok(()) => notes.push(Note::claim(
                &claim.info,
                NoteKind::Released {
                    error_class: error_class.to_string(),
                },
            )),
            Err(e) => notes.push(Note::claim(
                &claim.info,
                NoteKind::ReleaseFailed {
                    error: e.to_string(),
                    error_class: e.class_name(),
                },
            )),
        }
    }

    /// Keeps the claim after a crash (the binding's door says the body's error means
    /// the worker is going away: its effect may have happened): stops the heartbeat
    /// and writes nothing, so the lease decides what a later delivery does.
    ///
    /// Notes: the heartbeat's; a warning that the claim is kept.
    pub fn keep(&self, mut claim: Claim, notes: &mut Notes) {
        claim.stop_heartbeat(notes);
        notes.push(Note::claim(&claim.info, NoteKind::Kept));
    }

    /// [`Step::Run`] for `claim`, its heartbeat started when the options and the
    /// channel have one.
    fn run(&self, channel: &mut dyn Channel, mut claim: Claim) -> Step {
        if self.options.heartbeat {
            if let Some(handles) = channel.heartbeat_pool() {
                claim.heartbeat = Some(handles.heartbeat(
                    claim.info.job_type.clone(),
                    claim.info.operation_key.clone(),
                    claim.info.token,
                    self.options.lease_seconds,
                    self.options.max_run_seconds,
                ));
            }
        }
        claim.started = Instant::now();
        Step::Run(claim)
    }

    fn ran(&self, claim: &Claim, result_state: Option<ResultState>) -> Outcome {
        let mut outcome = Outcome::of(Decision::Ran);
        outcome.claim = Some(claim.info.clone());
        outcome.result_state = result_state;
        outcome
    }

    /// The options that decide, as the decision table ([`transitions`]) takes them,
    /// for a claim with `takeovers` stale takeovers (see [`Protocol::stale_policy`]).
    fn rules(&self, takeovers: i32) -> Rules {
        Rules {
            on_stale: self.stale_policy(takeovers),
            on_mismatch: self.options.on_mismatch,
            lookup: self.options.lookup.is_some(),
        }
    }

    /// Why the reclaim budget holds a claim with `takeovers` stale takeovers (more than
    /// `max_takeovers`), or `None` when it does not.
    fn budget_spent(&self, takeovers: i32) -> Option<String> {
        self.options
            .max_takeovers
            .filter(|max| takeovers > *max)
            .map(|max| reclaim_budget_reason(takeovers, max))
    }

    /// The job's `on_stale`, unless the reclaim budget is spent: then hold, whatever
    /// `on_stale` says.
    fn stale_policy(&self, takeovers: i32) -> OnStale {
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
    fn stale_step(
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
