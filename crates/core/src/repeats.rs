//! The repeats report's classification: each repeat of an operation classified from
//! the facts recorded with it. Pure functions: no database, no clock. The Ruby gem
//! (`IdempotentJob::Repeats::Classifier`, `Report.deliveries`) and the Python package
//! (`idempotent_job.repeats`) both call these, so the rules live here once.
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

use std::collections::HashMap;

use chrono::DateTime;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::records::Repeated;

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

/// `value` as epoch seconds: epoch seconds, epoch milliseconds (at or above
/// [`MILLISECONDS_FROM`], Sidekiq 8) or ISO 8601 / RFC 3339 text (ActiveJob's
/// `enqueued_at`, the record's times). None for anything else.
pub fn seconds(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => {
            let n = n.as_f64()?;
            Some(if n >= MILLISECONDS_FROM {
                n / 1000.0
            } else {
                n
            })
        }
        Value::String(s) => text_seconds(s),
        _ => None,
    }
}

/// ISO 8601 text with its offset as epoch seconds (None when it does not parse).
pub fn text_seconds(text: &str) -> Option<f64> {
    let t = DateTime::parse_from_rfc3339(text.trim()).ok()?;
    Some(t.timestamp() as f64 + f64::from(t.timestamp_subsec_nanos()) / 1e9)
}

/// Ruby's truthiness: anything but absent, null and false.
fn truthy(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !matches!(v, Value::Null | Value::Bool(false)))
}

/// A fact as text (a number's or other value's JSON text when it is not text).
fn text(value: Option<&Value>) -> Option<String> {
    truthy(value).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// A fact as an integer, the way Ruby's `to_i` reads it (absent, null or not a number: 0).
fn integer(value: Option<&Value>) -> i64 {
    match value {
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f.trunc() as i64))
            .unwrap_or(0),
        Some(Value::String(s)) => {
            let s = s.trim_start();
            let end = s
                .char_indices()
                .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
                .map_or(s.len(), |(i, _)| i);
            s[..end].parse().unwrap_or(0)
        }
        _ => 0,
    }
}

/// The delivery id, whichever door recorded it.
fn id_of(facts: &Facts) -> Option<String> {
    ["jid", "job_id", "task_id", "delivery_id", "message_id"]
        .iter()
        .find_map(|k| text(facts.get(*k)))
}

fn decision(facts: &Facts) -> Option<&str> {
    facts.get("decision").and_then(Value::as_str)
}

/// How many times the queue has retried this delivery: Sidekiq's `retry_count` is
/// absent before the first retry, then 0, 1…; ActiveJob's `executions` is 1, 2…;
/// Celery's `retries` is 0, 1….
fn retries(facts: &Facts) -> i64 {
    if facts.contains_key("retry_count") {
        return integer(facts.get("retry_count")) + 1;
    }
    if facts.contains_key("retries") {
        return integer(facts.get("retries"));
    }
    (integer(facts.get("executions")) - 1).max(0)
}

/// What a later receive of an SQS message (same id, a higher `receive_count`) is, from
/// what its previous receive was answered: after `in_progress` the door deferred it
/// (made it visible again after `retry_after`), so it is that deferred copy back
/// (`Some(true)`); after a won claim answered `claimed` again, the claim was released
/// (the body raised and the door left the message): the queue's retry (`Some(false)`).
/// Anything else (a takeover of the dead consumer's claim, meeting it live, a
/// completion) is left to the general rules (`None`): a redelivery.
pub fn sqs_return(facts: &Facts, earlier: &Facts) -> Option<bool> {
    let count = |f: &Facts| f.get("receive_count").and_then(Value::as_i64);
    match (count(facts), count(earlier)) {
        (Some(now), Some(before)) if now > before => match (decision(earlier), decision(facts)) {
            (Some("in_progress"), _) => Some(true),
            (Some(won), Some("claimed")) if WON.contains(&won) => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Whether the delivery met a live claim: answered "in progress", or answered
/// "completed" (or recorded without facts, as a transactional claim's copies are)
/// although it arrived (`at`) before the completion (`completed_at`), epoch seconds.
fn live_claim(facts: &Facts, at: Option<f64>, completed_at: Option<f64>) -> bool {
    let answered_completed = match facts.get("decision") {
        None => true,
        Some(v) => v.as_str() == Some("completed"),
    };
    decision(facts) == Some("in_progress")
        || (answered_completed && matches!((at, completed_at), (Some(a), Some(c)) if a < c))
}

fn since(at: Option<f64>, start: Option<f64>) -> Option<f64> {
    Some(at? - start?)
}

/// Classifies each delivery after the first.
///
/// `deliveries`: an operation's deliveries in arrival order, the first claim's first
/// (facts as the module describes). `completed_at`: when the operation completed, epoch
/// seconds (a `completed` answer to a delivery that arrived earlier means it waited for
/// that commit). `restarts`: recorded deploy/restart times, epoch seconds.
/// `restart_window`: seconds after a restart within which a redelivery is matched to it.
/// Returns one [`Repeat`] per delivery after the first (none for no deliveries).
pub fn classify(
    deliveries: &[Facts],
    completed_at: Option<f64>,
    restarts: &[f64],
    restart_window: f64,
) -> Vec<Repeat> {
    let Some(first) = deliveries.first() else {
        return Vec::new();
    };
    let claimed_at = first.get("at").and_then(seconds);
    let first_producer = text(first.get("producer"));
    let mut producers: Vec<String> = first_producer.iter().cloned().collect();
    // id => (latest facts, the cause of its first arrival as a repeat)
    let mut seen: HashMap<String, (&Facts, Option<Cause>)> = HashMap::new();
    if let Some(id) = id_of(first) {
        seen.insert(id, (first, None));
    }
    let mut claims = Vec::with_capacity(deliveries.len()); // per repeat: when the claim before it was won
    let mut won = claimed_at;
    let mut repeats: Vec<Repeat> = Vec::with_capacity(deliveries.len());
    for facts in &deliveries[1..] {
        claims.push(won);
        let at = facts.get("at").and_then(seconds);
        if decision(facts).is_some_and(|d| WON.contains(&d)) {
            won = at.or(won);
        }
        let id = id_of(facts);
        let earlier = id.as_ref().and_then(|id| seen.get(id)).copied();
        let live = live_claim(facts, at, completed_at);
        let producer = text(facts.get("producer"));
        let (cause, returned) = if !facts.contains_key("decision") {
            (
                if live {
                    Cause::ConcurrentCopy
                } else {
                    Cause::Unknown
                },
                false,
            )
        } else if let Some((earlier, first_cause)) = earlier {
            let sqs = sqs_return(facts, earlier);
            if retries(facts) > retries(earlier) || sqs == Some(false) {
                (Cause::QueueRetry, false)
            } else if integer(facts.get("deferrals")) > 0 || sqs == Some(true) {
                (first_cause.unwrap_or(Cause::ConcurrentCopy), true)
            } else {
                (Cause::Redelivery, false)
            }
        } else if live {
            (Cause::ConcurrentCopy, false)
        } else {
            match &producer {
                Some(p) if !producers.is_empty() => {
                    if producers.contains(p) {
                        (Cause::ReEnqueueSameProducer, false)
                    } else {
                        (Cause::ReEnqueueOtherProducer, false)
                    }
                }
                _ => (Cause::ReEnqueue, false),
            }
        };
        let enqueued = facts
            .get("enqueued_at")
            .and_then(seconds)
            .or_else(|| facts.get("created_at").and_then(seconds));
        let retry_count = match truthy(facts.get("retry_count")) {
            Some(v) => v.as_i64(),
            None => truthy(facts.get("executions"))
                .and_then(Value::as_i64)
                .map(|e| e - 1),
        };
        if let Some(id) = &id {
            let first_cause = earlier.and_then(|(_, c)| c).unwrap_or(cause);
            seen.insert(id.clone(), (facts, Some(first_cause)));
        }
        if let Some(p) = &producer {
            if !producers.contains(p) {
                producers.push(p.clone());
            }
        }
        repeats.push(Repeat {
            at,
            id,
            cause,
            after_claim: since(at, claimed_at),
            after_enqueue: since(at, enqueued),
            retry_count,
            producer,
            first_producer: first_producer.clone(),
            live_claim: live,
            deferred_return: returned,
            restart: None,
            decision: decision(facts).map(str::to_owned),
        });
    }
    took_over(&mut repeats);
    for (r, claimed) in repeats.iter_mut().zip(claims) {
        if r.cause == Cause::Redelivery && !r.deferred_return {
            r.restart = restart_near(r.at, claimed, restarts, restart_window);
        }
    }
    repeats
}

/// A delivery that took over an expired lease redid a dead worker's claim: it and its
/// earlier arrivals (a copy deferred behind that claim until the lease ran out) are
/// redeliveries.
fn took_over(repeats: &mut [Repeat]) {
    for i in 0..repeats.len() {
        if repeats[i].decision.as_deref() != Some("takeover") {
            continue;
        }
        match repeats[i].id.clone() {
            Some(id) => {
                for r in repeats.iter_mut() {
                    if r.id.as_deref() == Some(id.as_str()) && r.cause != Cause::QueueRetry {
                        r.cause = Cause::Redelivery;
                    }
                }
            }
            None => repeats[i].cause = Cause::Redelivery,
        }
    }
}

/// The latest restart at or before `at`, within `window` seconds, after the claim the
/// delivery redoes (`claimed`): a restart before that claim did not cause it.
fn restart_near(
    at: Option<f64>,
    claimed: Option<f64>,
    restarts: &[f64],
    window: f64,
) -> Option<f64> {
    let at = at?;
    restarts
        .iter()
        .copied()
        .filter(|&r| at >= r && at - r <= window && claimed.is_none_or(|c| r > c))
        .max_by(f64::total_cmp)
}

/// An operation's deliveries as [`classify`] reads them, from what the record keeps:
/// the first claim (`first_claimed_at`, epoch seconds, and its facts when known) and the
/// repeats' elements (`{"at", "job_class", "decision", "facts", "replayed"}`, put in time
/// order; an element without a decision has no facts). Each delivery gets `at` (epoch
/// seconds, null when unreadable); one with a decision gets `decision` (`claimed` for a
/// first claim or a retry's, others kept), `job_class`, and `replayed: true` when it
/// was answered from a stored result.
pub fn deliveries(
    first_claimed_at: f64,
    first_facts: Option<Facts>,
    repeat_facts: &[Value],
) -> Vec<Facts> {
    let mut first = first_facts.unwrap_or_default();
    first.insert("at".into(), number(first_claimed_at));
    first.insert("decision".into(), "claimed".into());
    let mut elements: Vec<&Value> = repeat_facts.iter().collect();
    elements.sort_by(|a, b| at_of(a).total_cmp(&at_of(b)));
    let mut out = Vec::with_capacity(elements.len() + 1);
    out.push(first);
    for element in elements {
        let at = element
            .get("at")
            .and_then(seconds)
            .map_or(Value::Null, number);
        let Some(decided) = element.get("decision") else {
            out.push(Map::from_iter([("at".to_owned(), at)]));
            continue;
        };
        let decided = match decided {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let decided = if CLAIMED.contains(&decided.as_str()) {
            "claimed".to_owned()
        } else {
            decided
        };
        let mut facts = match element.get("facts") {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        facts.insert("at".into(), at);
        facts.insert(
            "job_class".into(),
            element.get("job_class").cloned().unwrap_or(Value::Null),
        );
        facts.insert("decision".into(), decided.into());
        if truthy(element.get("replayed")).is_some() {
            facts.insert("replayed".into(), true.into());
        }
        out.push(facts);
    }
    out
}

fn at_of(element: &Value) -> f64 {
    element.get("at").and_then(seconds).unwrap_or(0.0)
}

fn number(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn epoch(t: &DateTime<chrono::Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}

/// A row of the report's SQL ([`crate::records::REPEATS_SQL`]) as deliveries
/// ([`row_deliveries_of`] of its parts).
///
/// Errors: [`Error::Config`] when the row's JSON text is not JSON (a damaged record).
pub fn row_deliveries(row: &Repeated) -> Result<Vec<Facts>> {
    let times: Vec<f64> = row.repeat_times.iter().map(epoch).collect();
    row_deliveries_of(
        &format!("{} {:?}", row.job_type, row.operation_key),
        epoch(&row.first_claimed_at),
        row.first_facts.as_deref(),
        &row.repeat_facts,
        &times,
        (row.attempts == 1)
            .then_some(row.delivery_id.as_deref())
            .flatten(),
    )
}

/// A report row's deliveries ([`deliveries`]) from its parts: the first claim
/// (`first_claimed_at`, epoch seconds; `first_facts`, JSON object text, when it sent
/// some; `claimed_once_id`, the record's delivery id when it was claimed once, taken as
/// the first delivery's `jid` when its facts name none) and `repeat_facts` (the JSON
/// array text of the record's repeat elements); a record kept before repeat facts
/// existed has only its `repeat_times` (epoch seconds: read as repeats without facts).
/// `what` names the operation in errors.
///
/// Errors: [`Error::Config`] when `first_facts` or `repeat_facts` is not JSON.
pub fn row_deliveries_of(
    what: &str,
    first_claimed_at: f64,
    first_facts: Option<&str>,
    repeat_facts: &str,
    repeat_times: &[f64],
    claimed_once_id: Option<&str>,
) -> Result<Vec<Facts>> {
    let parse = |text: &str| -> Result<Value> {
        serde_json::from_str(text)
            .map_err(|e| Error::Config(format!("the repeats of {what} are not JSON: {e}")))
    };
    let mut elements = match parse(repeat_facts)? {
        Value::Array(a) => a,
        _ => Vec::new(),
    };
    if elements.is_empty() {
        elements = repeat_times
            .iter()
            .map(|&t| Value::Object(Map::from_iter([("at".to_owned(), number(t))])))
            .collect();
    }
    let mut first = match first_facts.map(parse).transpose()? {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    if let Some(id) = claimed_once_id {
        if truthy(first.get("jid")).is_none() {
            first.insert("jid".into(), id.into());
        }
    }
    Ok(deliveries(first_claimed_at, Some(first), &elements))
}

/// One repeated operation of the report: the record's counts, its deliveries and its
/// classified repeats.
#[derive(Clone, Debug)]
pub struct RepeatedOperation {
    /// The report SQL's row.
    pub row: Repeated,
    /// Its deliveries ([`row_deliveries`]), the first claim's first.
    pub deliveries: Vec<Facts>,
    /// The producers that enqueued it, the first enqueue's first, each once.
    pub producers: Vec<String>,
    /// Repeats answered from a completion made with a stored result.
    pub replays: usize,
    /// Its repeats, arrival order ([`classify`]).
    pub repeats: Vec<Repeat>,
}

impl Repeat {
    /// The repeat as a JSON object: `at`, `after_claim`, `after_enqueue`, `restart`
    /// (epoch seconds / seconds, or null), `id`, `producer`, `first_producer`,
    /// `decision` (text or null), `cause` ([`Cause::name`]), `retry_count` (integer or
    /// null), `live_claim`, `deferred_return` (booleans): the Python package's dict,
    /// the Ruby Struct's members.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "at": self.at, "id": self.id, "cause": self.cause.name(),
            "after_claim": self.after_claim, "after_enqueue": self.after_enqueue,
            "retry_count": self.retry_count, "producer": self.producer,
            "first_producer": self.first_producer, "live_claim": self.live_claim,
            "deferred_return": self.deferred_return, "restart": self.restart,
            "decision": self.decision,
        })
    }
}

impl RepeatedOperation {
    /// The operation as a JSON object: `job_type`, `operation_key`, `status` (text),
    /// `attempts`, `takeovers`, `duplicates`, `mismatches`, `replays` (integers),
    /// `first_claimed_at`, `completed_at` (epoch seconds or null), `producers`,
    /// `job_classes` (arrays of text) and `repeats` (arrival order, [`Repeat::to_json`]).
    pub fn to_json(&self) -> Value {
        let r = &self.row;
        serde_json::json!({
            "job_type": r.job_type, "operation_key": r.operation_key, "status": r.status,
            "attempts": r.attempts, "takeovers": r.takeovers, "duplicates": r.duplicates,
            "mismatches": r.mismatches, "replays": self.replays,
            "first_claimed_at": epoch(&r.first_claimed_at),
            "completed_at": r.completed_at.as_ref().map(epoch),
            "producers": self.producers, "job_classes": r.job_classes,
            "repeats": self.repeats.iter().map(Repeat::to_json).collect::<Vec<_>>(),
        })
    }
}

/// The report's operations from the report SQL's rows (see [`crate::operations::repeats`]),
/// each repeat classified; `restarts` (epoch seconds) and `restart_window` (seconds) as
/// [`classify`] takes them.
///
/// Errors: [`Error::Config`] for a negative or non-finite window, or a row whose JSON
/// text is damaged.
pub fn operations(
    rows: Vec<Repeated>,
    restarts: &[f64],
    restart_window: f64,
) -> Result<Vec<RepeatedOperation>> {
    check_window(restart_window)?;
    rows.into_iter()
        .map(|row| {
            let deliveries = row_deliveries(&row)?;
            let mut producers: Vec<String> = Vec::new();
            for p in deliveries.iter().filter_map(|d| text(d.get("producer"))) {
                if !producers.contains(&p) {
                    producers.push(p);
                }
            }
            let replays = deliveries
                .iter()
                .filter(|d| truthy(d.get("replayed")).is_some())
                .count();
            let repeats = classify(
                &deliveries,
                row.completed_at.as_ref().map(epoch),
                restarts,
                restart_window,
            );
            Ok(RepeatedOperation {
                row,
                deliveries,
                producers,
                replays,
                repeats,
            })
        })
        .collect()
}

/// Checks a repeats report's `restart_window` (seconds) before any row is read.
///
/// Errors: [`Error::Config`] unless `restart_window` is a finite number of seconds, 0 or more.
pub fn check_window(restart_window: f64) -> Result<()> {
    if restart_window.is_finite() && restart_window >= 0.0 {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "restart_window must be a finite number of seconds, 0 or more, got {restart_window}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: f64 = 1_764_547_200.0;

    fn delivery(at: f64, jid: &str, more: Value) -> Facts {
        let mut f = json!({"at": T0 + at, "jid": jid, "decision": "completed",
                           "enqueued_at": T0 + at - 0.01, "producer": "orders"});
        for (k, v) in more.as_object().unwrap() {
            f[k] = v.clone();
        }
        f.as_object().unwrap().clone()
    }

    fn causes(d: &[Facts]) -> Vec<Cause> {
        classify(d, None, &[], DEFAULT_RESTART_WINDOW)
            .iter()
            .map(|r| r.cause)
            .collect()
    }

    #[test]
    fn copies_meeting_a_live_claim_and_their_deferred_returns() {
        let d = [
            delivery(0.0, "a", json!({"decision": "claimed"})),
            delivery(0.002, "b", json!({"decision": "in_progress"})),
            delivery(1.0, "b", json!({"deferrals": 1})),
        ];
        let r = classify(&d, None, &[], 120.0);
        assert_eq!(
            r.iter().map(|r| r.cause).collect::<Vec<_>>(),
            [Cause::ConcurrentCopy; 2]
        );
        assert_eq!(
            r.iter().map(|r| r.deferred_return).collect::<Vec<_>>(),
            [false, true]
        );
        assert!(r[0].live_claim);
        assert!((r[0].after_claim.unwrap() - 0.002).abs() < 1e-6);
    }

    #[test]
    fn queue_retry_redelivery_and_restart() {
        let d = [
            delivery(0.0, "a", json!({"decision": "claimed"})),
            delivery(30.0, "a", json!({"retry_count": 0, "decision": "claimed"})),
            delivery(400.0, "a", json!({"retry_count": 0})),
        ];
        let r = classify(&d, None, &[T0 - 5000.0, T0 + 350.0], 120.0);
        assert_eq!(r[0].cause, Cause::QueueRetry);
        assert_eq!(r[1].cause, Cause::Redelivery);
        assert_eq!(r[1].restart, Some(T0 + 350.0));
        assert_eq!(r[0].retry_count, Some(0));
    }

    #[test]
    fn re_enqueues_by_producer_and_without_facts() {
        let d = [
            delivery(0.0, "a", json!({"decision": "claimed"})),
            delivery(3600.0, "b", json!({})),
            delivery(7200.0, "c", json!({"producer": "stripe"})),
            delivery(7400.0, "e", json!({"producer": null})),
            Map::from_iter([("at".to_owned(), json!(T0 + 9000.0))]),
        ];
        assert_eq!(
            causes(&d),
            [
                Cause::ReEnqueueSameProducer,
                Cause::ReEnqueueOtherProducer,
                Cause::ReEnqueue,
                Cause::Unknown
            ]
        );
    }

    #[test]
    fn a_takeover_and_its_deferred_arrival_are_redeliveries() {
        let d = [
            delivery(0.0, "a", json!({"decision": "claimed"})),
            delivery(2.0, "b", json!({"decision": "in_progress"})),
            delivery(6.0, "b", json!({"decision": "takeover", "deferrals": 1})),
        ];
        let r = classify(&d, None, &[], 120.0);
        assert_eq!(
            r.iter().map(|r| r.cause).collect::<Vec<_>>(),
            [Cause::Redelivery; 2]
        );
        assert_eq!(
            r.iter().map(|r| r.deferred_return).collect::<Vec<_>>(),
            [false, true]
        );
    }

    fn sqs(at: f64, receives: i64, decision: &str) -> Facts {
        json!({"at": T0 + at, "message_id": "m", "receive_count": receives, "decision": decision})
            .as_object()
            .unwrap()
            .clone()
    }

    #[test]
    fn reads_sqs_receives_by_what_the_previous_receive_was_answered() {
        // A consumer killed in the body: the message back after its visibility timeout
        // meets the dead claim (deferred), comes back, and takes the stale claim over.
        let killed = [
            sqs(0.0, 1, "claimed"),
            sqs(3.0, 2, "in_progress"),
            sqs(5.0, 3, "in_progress"),
            sqs(7.0, 4, "takeover"),
        ];
        let r = classify(&killed, None, &[], 120.0);
        assert_eq!(
            r.iter().map(|r| r.cause).collect::<Vec<_>>(),
            [Cause::Redelivery; 3]
        );
        assert_eq!(
            r.iter().map(|r| r.deferred_return).collect::<Vec<_>>(),
            [false, true, true]
        );
        // A raising body: the message left, received again, claims the released claim.
        let raised = [sqs(0.0, 1, "claimed"), sqs(2.0, 2, "claimed")];
        assert_eq!(causes(&raised), [Cause::QueueRetry]);
        // Its consumer died past the lease: the next receive takes over at once.
        let taken = [sqs(0.0, 1, "claimed"), sqs(9.0, 2, "takeover")];
        assert_eq!(causes(&taken), [Cause::Redelivery]);
        // Two sends of one body: another message id, deferred behind the live claim, back
        // to find the completion.
        let mut copy = [sqs(0.01, 1, "in_progress"), sqs(2.0, 2, "completed")];
        for c in &mut copy {
            c.insert("message_id".into(), "m2".into());
        }
        let r = classify(
            &[&[sqs(0.0, 1, "claimed")][..], &copy].concat(),
            None,
            &[],
            120.0,
        );
        assert_eq!(
            r.iter()
                .map(|r| (r.cause, r.deferred_return))
                .collect::<Vec<_>>(),
            [
                (Cause::ConcurrentCopy, false),
                (Cause::ConcurrentCopy, true)
            ]
        );
    }

    #[test]
    fn reads_seconds_milliseconds_and_iso_text() {
        assert_eq!(
            seconds(&json!(1_764_547_200_123_i64)),
            Some(1_764_547_200.123)
        );
        assert_eq!(seconds(&json!("2025-12-01T00:00:01Z")), Some(T0 + 1.0));
        assert_eq!(seconds(&json!("yesterday")), None);
        assert_eq!(seconds(&Value::Null), None);
    }

    #[test]
    fn reads_a_records_elements_in_time_order() {
        let d = deliveries(
            T0,
            Some(json!({"jid": "a"}).as_object().unwrap().clone()),
            &[
                json!({"at": T0 + 30.0, "decision": "retry", "facts": {"jid": "a", "retry_count": 0}}),
                json!({"at": "2025-12-01T00:00:00.5+00:00", "decision": "in_progress", "facts": {"jid": "b"}}),
                json!({"at": (T0 + 60.0) * 1000.0}),
            ],
        );
        assert_eq!(d[1]["jid"], "b");
        assert_eq!(d[1]["at"], json!(T0 + 0.5));
        assert_eq!(d[2]["decision"], "claimed");
        assert_eq!(d[3], json!({"at": T0 + 60.0}).as_object().unwrap().clone());
        assert_eq!(
            causes(&d),
            [Cause::ConcurrentCopy, Cause::QueueRetry, Cause::Unknown]
        );
    }
}
