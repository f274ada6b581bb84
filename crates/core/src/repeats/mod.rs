//! The repeats report's classification: each repeat of an operation classified from
//! the facts recorded with it. Pure functions: no database, no clock. The Ruby gem
//! (`IdempotentJob::Repeats::Classifier`, `Report.deliveries`) and the Python package
//! (`idempotent_job.repeats`) both call these, so the rules live here once. The report as
//! people read it — the summary per job type, the pairs of producers, each operation's
//! notes, the text lines and the CSV — is printed here too (`report.rs`, its numbers,
//! times and quoting in [`text`]): Ruby's `rake idempotent_job:repeats` and Python's
//! `idempotent_job.repeats_report` print [`report_json`]'s parts.
//!
//! A delivery's facts (a JSON object, as the doors record them, see
//! [`crate::record::ClaimRequest`]'s `facts_json`) are:
//! * `at` (epoch seconds by the database clock): when it reached the claim;
//! * `jid` (text): its delivery id (Sidekiq jid; `job_id` for ActiveJob, `task_id` for
//!   the Celery door, or `delivery_id` / `message_id` are read too);
//! * `retry_count` (integer, Sidekiq: absent before the queue's first retry),
//!   `executions` (integer, ActiveJob: 1 on the first run, 2 on the first retry),
//!   `retries` (integer, Celery: 0 on the first run, 1 on the first retry);
//! * `receive_count` (integer, the SQS door: SQS's ApproximateReceiveCount, 1 on the
//!   first receive): it counts every receive of a message, whatever brought it back (its
//!   visibility timeout ran out after the body raised or its consumer died, or the door
//!   made it visible again after deferring it behind a live claim), so it is not read as
//!   a retry count; a later receive of a message id is told by what its previous
//!   receive was answered: see [`sqs_return`];
//! * `enqueued_at` / `created_at` (epoch seconds; Sidekiq 8's integer milliseconds and
//!   ActiveJob's ISO 8601 text are read as such too);
//! * `deferrals` (integer): how many times the library deferred this copy already;
//! * `producer` (text): who enqueued it;
//! * `decision` (text): what the claim statement answered it — `claimed` (a first
//!   claim or a retry's), `takeover` (it took over an expired lease), `in_progress`
//!   (it met a live claim), `completed`, `held`, `given_up`, `refused`.
//!
//! A delivery met a live claim when it was answered `in_progress`, or answered
//! `completed` although it arrived before the operation completed (it waited on the
//! record's row lock for a transactional claim's commit).
//!
//! Causes ([`Cause`]), in the order they are tried:
//! * queue retry — the same delivery again with more retries (`retry_count`,
//!   `executions` or `retries`): the queue's retry after the job raised;
//! * redelivery — the same delivery again without a new retry, or any delivery that
//!   took over an expired lease: work redone after a worker died (a crash, a restart, a
//!   deploy; `restart` names the recorded deploy/restart it follows within the window,
//!   when that restart came after the claim it redoes);
//! * concurrent copy — another delivery that met a live claim;
//! * re-enqueue, same producer / other producer — another delivery after the claim
//!   ended, enqueued by a producer seen before for this operation, or not;
//! * re-enqueue — the same, with no producer recorded to compare;
//! * unknown — no facts were recorded with it (a record kept before the upgrade) and it
//!   came after the completion (one that came before overlapped the claim: a concurrent
//!   copy, as a transactional claim's copies waiting on its row lock are).
//!
//! A copy the library deferred that comes back (same id, `deferrals` above 0, or a later
//! SQS receive of a message whose previous receive met a live claim) is not a new
//! repeat: it keeps the cause of its id's first arrival, with `deferred_return`.
use serde_json::{Map, Value};

mod classify;
mod deliveries;
mod facts;
mod operations;
mod report;
#[cfg(test)]
mod tests;
pub mod text;

pub use classify::{classify, sqs_return};
pub use deliveries::{deliveries, row_deliveries, row_deliveries_of};
pub use facts::{seconds, text_seconds};
pub use operations::{
    check_time, check_window, operations, window_refused, RepeatedOperation, MAX_EPOCH_SECONDS,
    MIN_EPOCH_SECONDS,
};
pub use report::{
    csv, lines, notes, producer_pairs, report_json, report_of_json, summary, ReportOperation,
    Summary, CSV_HEADERS,
};

/// One delivery's facts: a JSON object with text keys.
pub type Facts = Map<String, Value>;

/// Seconds after a restart within which a redelivery is matched to it, by default.
pub const DEFAULT_RESTART_WINDOW: f64 = 120.0;

/// Epoch values at or above this are milliseconds (year 5138 in seconds).
pub const MILLISECONDS_FROM: f64 = 100_000_000_000.0;

/// Decisions of a delivery that won the claim.
const WON: [&str; 2] = ["claimed", "takeover"];

/// Claim-statement decisions recorded with a repeat that read as `claimed` (a won claim
/// that is not a takeover).
const CLAIMED: [&str; 3] = ["claimed", "first", "retry"];

/// Why an operation was delivered again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// It met a live claim.
    ConcurrentCopy,
    /// The same delivery with more retries: the queue retried after the job raised.
    QueueRetry,
    /// The same delivery without a new retry, or a takeover of a dead worker's claim.
    Redelivery,
    /// Another delivery after the claim ended, by a producer seen before.
    ReEnqueueSameProducer,
    /// Another delivery after the claim ended, by a producer not seen before.
    ReEnqueueOtherProducer,
    /// Another delivery after the claim ended, with no producer to compare.
    ReEnqueue,
    /// Recorded without facts, after the completion.
    Unknown,
}

impl Cause {
    /// Every cause, in report order.
    pub const ALL: [Cause; 7] = [
        Cause::ConcurrentCopy,
        Cause::QueueRetry,
        Cause::Redelivery,
        Cause::ReEnqueueSameProducer,
        Cause::ReEnqueueOtherProducer,
        Cause::ReEnqueue,
        Cause::Unknown,
    ];

    /// The cause's name (`concurrent_copy`, `queue_retry`, `redelivery`,
    /// `re_enqueue_same_producer`, `re_enqueue_other_producer`, `re_enqueue`,
    /// `unknown`): Ruby's Symbol, Python's text, the CSV's `cause` column.
    pub fn name(self) -> &'static str {
        match self {
            Cause::ConcurrentCopy => "concurrent_copy",
            Cause::QueueRetry => "queue_retry",
            Cause::Redelivery => "redelivery",
            Cause::ReEnqueueSameProducer => "re_enqueue_same_producer",
            Cause::ReEnqueueOtherProducer => "re_enqueue_other_producer",
            Cause::ReEnqueue => "re_enqueue",
            Cause::Unknown => "unknown",
        }
    }

    /// How the cause reads in a report (`concurrent copy`, `redelivery/restart`…).
    pub fn label(self) -> &'static str {
        match self {
            Cause::ConcurrentCopy => "concurrent copy",
            Cause::QueueRetry => "queue retry",
            Cause::Redelivery => "redelivery/restart",
            Cause::ReEnqueueSameProducer => "re-enqueue, same producer",
            Cause::ReEnqueueOtherProducer => "re-enqueue, other producer",
            Cause::ReEnqueue => "re-enqueue",
            Cause::Unknown => "no facts recorded",
        }
    }
}

/// One classified repeat. Times are epoch seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Repeat {
    /// When it reached the claim.
    pub at: Option<f64>,
    /// Its delivery id.
    pub id: Option<String>,
    /// Why it came.
    pub cause: Cause,
    /// Seconds since the operation's first claim.
    pub after_claim: Option<f64>,
    /// Seconds since its own enqueue (None when unknown).
    pub after_enqueue: Option<f64>,
    /// The queue's retries before this one: Sidekiq's `retry_count`, ActiveJob's
    /// `executions` - 1.
    pub retry_count: Option<i64>,
    /// Who enqueued it.
    pub producer: Option<String>,
    /// Who enqueued the first delivery.
    pub first_producer: Option<String>,
    /// It met a live claim.
    pub live_claim: bool,
    /// A deferred copy back (not a new repeat).
    pub deferred_return: bool,
    /// The deploy/restart it follows (one of the `restarts` given), for a redelivery.
    pub restart: Option<f64>,
    /// What the claim statement answered it.
    pub decision: Option<String>,
}
