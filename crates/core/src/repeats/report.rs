//! The repeats report as people read it: a summary per job type, the pairs of producers
//! that enqueue the same operations, a note list per operation, the report as text
//! lines and as CSV (one row per repeat). Pure: it is given the classified operations
//! ([`super::operations`], or a binding's own as JSON: [`ReportOperation::from_json`])
//! and computes; it reads and writes nothing. Ruby's `rake idempotent_job:repeats` /
//! `IdempotentJob::Repeats::Report` and Python's `idempotent_job.repeats_report` print
//! what [`report_json`] returns.

use serde_json::{json, Value};

use super::text::{csv_field, float, iso8601, named, neutralised, quoted, round};
use super::{Cause, Repeat, RepeatedOperation};
use crate::error::{Error, Result};

/// The CSV's columns, one row per repeat.
pub const CSV_HEADERS: [&str; 14] = [
    "job_type",
    "operation_key",
    "status",
    "at",
    "cause",
    "delivery_id",
    "retry_count",
    "after_claim_s",
    "after_enqueue_s",
    "live_claim",
    "deferred_return",
    "producer",
    "first_producer",
    "restart_at",
];

/// What the report prints of one repeated operation.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOperation {
    /// Its job type.
    pub job_type: String,
    /// Its operation key.
    pub operation_key: String,
    /// The record's status (`completed`, `held`…).
    pub status: String,
    /// Stale claims taken over.
    pub takeovers: i64,
    /// Deliveries with another payload digest.
    pub mismatches: i64,
    /// Repeats answered from a completion made with a stored result.
    pub replays: i64,
    /// The producers that enqueued it, the first enqueue's first, each once.
    pub producers: Vec<String>,
    /// The job classes that delivered it.
    pub job_classes: Vec<String>,
    /// Its repeats, arrival order.
    pub repeats: Vec<Repeat>,
}

impl From<&RepeatedOperation> for ReportOperation {
    fn from(op: &RepeatedOperation) -> Self {
        ReportOperation {
            job_type: op.row.job_type.clone(),
            operation_key: op.row.operation_key.clone(),
            status: op.row.status.clone(),
            takeovers: op.row.takeovers.into(),
            mismatches: op.row.mismatches.into(),
            replays: op.replays as i64,
            producers: op.producers.clone(),
            job_classes: op.row.job_classes.clone(),
            repeats: op.repeats.clone(),
        }
    }
}

fn field_text(value: &Value, name: &str, what: &str) -> Result<String> {
    match value.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        other => Err(Error::Config(format!(
            "{what}: {name} must be text, got {}",
            other.map_or("nothing".into(), Value::to_string)
        ))),
    }
}

fn field_texts(value: &Value, name: &str) -> Vec<String> {
    match value.get(name) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

fn field_count(value: &Value, name: &str) -> i64 {
    value.get(name).and_then(Value::as_i64).unwrap_or(0)
}

impl ReportOperation {
    /// An operation from its JSON object, the shape of
    /// [`RepeatedOperation::to_json`]: `job_type`, `operation_key`, `status` (text),
    /// `takeovers`, `mismatches`, `replays` (integers, absent or null: 0), `producers`,
    /// `job_classes` (arrays of text, absent: empty) and `repeats` (objects of
    /// [`Repeat::to_json`]'s shape).
    ///
    /// Errors: [`Error::Config`] naming the operation and the field for a missing or
    /// mistyped text, or a repeat whose cause is not one of [`Cause::ALL`].
    pub fn from_json(value: &Value) -> Result<Self> {
        let job_type = field_text(value, "job_type", "a repeated operation")?;
        let operation_key = field_text(value, "operation_key", &job_type)?;
        let what = format!("the repeated operation {job_type} {operation_key:?}");
        let repeats = match value.get("repeats") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|r| Repeat::from_json(r, &what))
                .collect::<Result<Vec<_>>>()?,
            None | Some(Value::Null) => Vec::new(),
            Some(other) => {
                return Err(Error::Config(format!(
                    "{what}: repeats must be an array, got {other}"
                )))
            }
        };
        Ok(ReportOperation {
            status: field_text(value, "status", &what)?,
            takeovers: field_count(value, "takeovers"),
            mismatches: field_count(value, "mismatches"),
            replays: field_count(value, "replays"),
            producers: field_texts(value, "producers"),
            job_classes: field_texts(value, "job_classes"),
            repeats,
            job_type,
            operation_key,
        })
    }
}

impl Cause {
    /// The cause named `name` ([`Cause::name`]), None for another text.
    pub fn from_name(name: &str) -> Option<Cause> {
        Cause::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl Repeat {
    /// A repeat from its JSON object ([`Repeat::to_json`]'s shape; absent or null
    /// members read as None / false). `what` names its operation in errors.
    ///
    /// Errors: [`Error::Config`] when `cause` is not one of [`Cause::ALL`]'s names.
    pub fn from_json(value: &Value, what: &str) -> Result<Repeat> {
        let name = value.get("cause").and_then(Value::as_str).unwrap_or("");
        let cause = Cause::from_name(name).ok_or_else(|| {
            Error::Config(format!(
                "{what}: a repeat's cause must be one of {}, got {:?}",
                Cause::ALL.map(Cause::name).join(", "),
                value.get("cause").unwrap_or(&Value::Null).to_string()
            ))
        })?;
        let number = |k: &str| value.get(k).and_then(Value::as_f64);
        let text = |k: &str| value.get(k).and_then(Value::as_str).map(str::to_owned);
        let flag = |k: &str| value.get(k).and_then(Value::as_bool).unwrap_or(false);
        Ok(Repeat {
            at: number("at"),
            id: text("id"),
            cause,
            after_claim: number("after_claim"),
            after_enqueue: number("after_enqueue"),
            retry_count: value.get("retry_count").and_then(Value::as_i64),
            producer: text("producer"),
            first_producer: text("first_producer"),
            live_claim: flag("live_claim"),
            deferred_return: flag("deferred_return"),
            restart: number("restart"),
            decision: text("decision"),
        })
    }
}

/// One job type's counts in the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Repeated operations.
    pub operations: usize,
    /// Their repeats, deferred copies back left out.
    pub repeats: usize,
    /// Per cause, [`Cause::ALL`]'s order (deferred copies back left out).
    pub causes: [usize; 7],
    /// Redeliveries matched to a restart.
    pub near_restart: usize,
    /// Deferred copies back.
    pub deferred_returns: usize,
    /// Operations enqueued by more than one producer.
    pub several_producers: usize,
    /// Stale claims taken over.
    pub takeovers: i64,
    /// Operations held for a person.
    pub held: usize,
    /// Operations delivered with different payloads.
    pub mismatched: usize,
    /// Repeats answered with a stored result.
    pub replays: i64,
}

impl Summary {
    /// The counts by name, in the report's order: `operations`, `repeats`, one per cause
    /// ([`Cause::name`]), `near_restart`, `deferred_returns`, `several_producers`,
    /// `takeovers`, `held`, `mismatched`, `replays`: Ruby's Hash keys, Python's dict's.
    pub fn counts(&self) -> Vec<(&'static str, i64)> {
        let n = |v: usize| v as i64;
        let mut out = vec![
            ("operations", n(self.operations)),
            ("repeats", n(self.repeats)),
        ];
        out.extend(
            Cause::ALL
                .iter()
                .zip(self.causes)
                .map(|(c, k)| (c.name(), n(k))),
        );
        out.extend([
            ("near_restart", n(self.near_restart)),
            ("deferred_returns", n(self.deferred_returns)),
            ("several_producers", n(self.several_producers)),
            ("takeovers", self.takeovers),
            ("held", n(self.held)),
            ("mismatched", n(self.mismatched)),
            ("replays", self.replays),
        ]);
        out
    }

    fn of(cause: Cause) -> usize {
        Cause::ALL.iter().position(|c| *c == cause).unwrap_or(0)
    }
}

/// The counts per job type, job types in the order they first appear.
pub fn summary(operations: &[ReportOperation]) -> Vec<(String, Summary)> {
    let mut out: Vec<(String, Summary)> = Vec::new();
    for op in operations {
        let at = match out.iter().position(|(t, _)| *t == op.job_type) {
            Some(i) => i,
            None => {
                out.push((op.job_type.clone(), Summary::default()));
                out.len() - 1
            }
        };
        let s = &mut out[at].1;
        s.operations += 1;
        for r in &op.repeats {
            if r.deferred_return {
                s.deferred_returns += 1;
                continue;
            }
            s.repeats += 1;
            s.causes[Summary::of(r.cause)] += 1;
            s.near_restart += usize::from(r.restart.is_some());
        }
        s.several_producers += usize::from(op.producers.len() > 1);
        s.takeovers += op.takeovers;
        s.held += usize::from(op.status == "held");
        s.mismatched += usize::from(op.mismatches > 0);
        s.replays += op.replays;
    }
    out
}

/// Per job type and pair of producers (the first before the second in byte order), how
/// many operations both enqueued; most first, then by job type and producers.
pub fn producer_pairs(operations: &[ReportOperation]) -> Vec<((String, String, String), usize)> {
    let mut pairs: Vec<((String, String, String), usize)> = Vec::new();
    for op in operations {
        let mut producers = op.producers.clone();
        producers.sort();
        producers.dedup();
        for (i, a) in producers.iter().enumerate() {
            for b in &producers[i + 1..] {
                let key = (op.job_type.clone(), a.clone(), b.clone());
                match pairs.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, n)) => *n += 1,
                    None => pairs.push((key, 1)),
                }
            }
        }
    }
    pairs.sort_by(|(ka, a), (kb, b)| b.cmp(a).then_with(|| ka.cmp(kb)));
    pairs
}

/// `number` and its noun, singular for one: `1 repeat`, `2 repeats`.
fn count(number: i64, one: &str, many: &str) -> String {
    format!("{number} {}", if number == 1 { one } else { many })
}

/// Names ([`named`]: quoted unless plain) joined with `, `.
fn names(items: &[String]) -> String {
    items
        .iter()
        .map(|n| named(n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What is worth knowing of an operation beyond its repeats: several producers or job
/// classes, deliveries with different payloads, stale claims taken over, held.
pub fn notes(op: &ReportOperation) -> Vec<String> {
    let mut notes = Vec::new();
    if op.producers.len() > 1 {
        notes.push(format!(
            "enqueued by {} producers: {}",
            op.producers.len(),
            names(&op.producers)
        ));
    }
    if op.job_classes.len() > 1 {
        notes.push(format!(
            "delivered by {} job classes: {}",
            op.job_classes.len(),
            names(&op.job_classes)
        ));
    }
    if op.mismatches > 0 {
        notes.push(format!(
            "{} with different arguments (payload digest)",
            count(op.mismatches, "delivery", "deliveries")
        ));
    }
    if op.takeovers > 0 {
        notes.push(format!(
            "{} taken over",
            count(op.takeovers, "stale claim", "stale claims")
        ));
    }
    if op.status == "held" {
        notes.push("held for a person".into());
    }
    notes
}

/// One repeat as text: its cause, seconds after the first claim (one decimal), and
/// what else is known of it.
fn repeat_text(r: &Repeat) -> String {
    // (+ 0.0: a copy whose transaction began a moment before the claim's reads 0.0, not -0.0)
    let after = r
        .after_claim
        .map_or(String::new(), |a| float(round(a, 1) + 0.0));
    let mut text = format!("{} after {after} s", r.cause.label());
    if r.deferred_return {
        text.push_str(" (deferred copy back)");
    }
    if let Some(at) = r.restart.and_then(|t| iso8601(t, 0)) {
        text.push_str(&format!(" near the restart at {at}"));
    }
    if r.cause == Cause::ReEnqueueOtherProducer {
        text.push_str(&format!(
            " by {}",
            named(r.producer.as_deref().unwrap_or(""))
        ));
    }
    text
}

fn operation_line(op: &ReportOperation) -> String {
    let counted = op.repeats.iter().filter(|r| !r.deferred_return).count() as i64;
    let repeats: Vec<String> = op.repeats.iter().map(repeat_text).collect();
    let notes = notes(op);
    format!(
        "{} {}: {}, {} ({}){}",
        named(&op.job_type),
        quoted(&op.operation_key),
        op.status,
        count(counted, "repeat", "repeats"),
        repeats.join(", "),
        if notes.is_empty() {
            String::new()
        } else {
            format!("; {}", notes.join("; "))
        }
    )
}

fn summary_line(job_type: &str, s: &Summary) -> String {
    let causes: Vec<String> = Cause::ALL
        .iter()
        .zip(s.causes)
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| format!("{n} {}", c.label()))
        .collect();
    let mut extra = Vec::new();
    if s.near_restart > 0 {
        extra.push(format!("{} near a restart", s.near_restart));
    }
    if s.deferred_returns > 0 {
        extra.push(format!(
            "{} back",
            count(
                s.deferred_returns as i64,
                "deferred copy",
                "deferred copies"
            )
        ));
    }
    if s.several_producers > 0 {
        extra.push(format!(
            "{} enqueued by several producers",
            s.several_producers
        ));
    }
    if s.replays > 0 {
        extra.push(format!("{} replayed a stored result", s.replays));
    }
    format!(
        "{}: {} repeated {} — {}{}",
        named(job_type),
        count(s.operations as i64, "operation", "operations"),
        count(s.repeats as i64, "time", "times"),
        causes.join(", "),
        if extra.is_empty() {
            String::new()
        } else {
            format!("; {}", extra.join(", "))
        }
    )
}

/// The report as text: one line per operation (job type, quoted key, status, its
/// repeats, its [`notes`]), then one per job type ([`summary`]), then one per pair of
/// producers ([`producer_pairs`]). Job types, producers and job classes are written as
/// they are when plain, else quoted ([`named`]): a producer holding a newline cannot
/// forge a line.
pub fn lines(operations: &[ReportOperation]) -> Vec<String> {
    let mut out: Vec<String> = operations.iter().map(operation_line).collect();
    out.extend(summary(operations).iter().map(|(t, s)| summary_line(t, s)));
    out.extend(
        producer_pairs(operations)
            .into_iter()
            .map(|((t, a, b), n)| {
                format!(
                    "{} and {} both enqueue {} for the same operation: {}",
                    named(&a),
                    named(&b),
                    named(&t),
                    count(n as i64, "operation", "operations")
                )
            }),
    );
    out
}

/// The report as CSV: a [`CSV_HEADERS`] row, then one row per repeat (arrival order,
/// deferred copies back included), LF line ends. `at` is ISO 8601 UTC with
/// microseconds, `restart_at` to the second; `after_claim_s` and `after_enqueue_s` are
/// seconds rounded to 6 decimals; text cells that start like a formula are neutralised
/// with a leading single quote.
pub fn csv(operations: &[ReportOperation]) -> String {
    let mut out = CSV_HEADERS.join(",");
    out.push('\n');
    for op in operations {
        for r in &op.repeats {
            let text = |s: &str| Some(neutralised(s));
            let seconds = |v: Option<f64>| v.map(|v| float(round(v, 6)));
            let cells: [Option<String>; 14] = [
                text(&op.job_type),
                text(&op.operation_key),
                Some(op.status.clone()),
                r.at.and_then(|t| iso8601(t, 6)).and_then(|t| text(&t)),
                Some(r.cause.name().to_owned()),
                r.id.as_deref().and_then(text),
                r.retry_count.map(|n| n.to_string()),
                seconds(r.after_claim),
                seconds(r.after_enqueue),
                Some(r.live_claim.to_string()),
                Some(r.deferred_return.to_string()),
                r.producer.as_deref().and_then(text),
                r.first_producer.as_deref().and_then(text),
                r.restart.and_then(|t| iso8601(t, 0)).and_then(|t| text(&t)),
            ];
            let row: Vec<String> = cells.iter().map(|c| csv_field(c.as_deref())).collect();
            out.push_str(&row.join(","));
            out.push('\n');
        }
    }
    out
}

/// The whole report of `operations` as one JSON object, for the bindings: `notes` (per
/// operation, its [`notes`]), `summary` (an array of `[job_type, [[name, count], …]]`
/// in [`summary`]'s order, counts named as [`Summary::counts`]), `producer_pairs` (an
/// array of `[job_type, producer, producer, operations]`, most first), `lines` (the
/// text, [`lines`]) and `csv` (text, [`csv`]). Arrays keep the report's order.
pub fn report_json(operations: &[ReportOperation]) -> Value {
    json!({
        "notes": operations.iter().map(notes).collect::<Vec<_>>(),
        "summary": summary(operations)
            .into_iter()
            .map(|(t, s)| json!([t, s.counts()]))
            .collect::<Vec<_>>(),
        "producer_pairs": producer_pairs(operations)
            .into_iter()
            .map(|((t, a, b), n)| json!([t, a, b, n]))
            .collect::<Vec<_>>(),
        "lines": lines(operations),
        "csv": csv(operations),
    })
}

/// [`report_json`] of operations given as JSON text: an array of objects of
/// [`ReportOperation::from_json`]'s shape (what Python's `idempotent_job.repeats`
/// returns; what Ruby's `Repeats::Report` hands over).
///
/// Errors: [`Error::Config`] for text that is not a JSON array of such objects.
pub fn report_of_json(operations_json: &str) -> Result<Value> {
    let value: Value = serde_json::from_str(operations_json).map_err(|e| {
        Error::Config(format!(
            "the repeated operations must be JSON text (an array of objects): {e}"
        ))
    })?;
    let Value::Array(items) = value else {
        return Err(Error::Config(
            "the repeated operations must be a JSON array of objects".into(),
        ));
    };
    let operations = items
        .iter()
        .map(ReportOperation::from_json)
        .collect::<Result<Vec<_>>>()?;
    Ok(report_json(&operations))
}
