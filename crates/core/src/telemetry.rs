//! Tracing vocabulary (issue 34): the span name, attribute names and outcome labels every
//! binding puts on a delivery's OpenTelemetry span, so a repeat shows as what it is (a
//! replay, a deferral, a hold) and never as an error. Bindings only translate: Python's
//! `idempotent_job._tracing` asks [`span_attributes`] through the native module.

use crate::canonical::digest_text;

/// The span's name prefix: `idempotency <job type>`.
pub const SPAN_PREFIX: &str = "idempotency";
/// The tracer's (instrumentation scope's) name.
pub const TRACER_NAME: &str = "idempotent_job";

/// Attribute: what the delivery came to ([`outcome_label`]).
pub const ATTR_OUTCOME: &str = "idempotency.outcome";
/// Attribute: the job type (the record's scope).
pub const ATTR_JOB_TYPE: &str = "idempotency.job_type";
/// Attribute: [`key_hash`] of the operation key (the raw key is never put on a span).
pub const ATTR_KEY_HASH: &str = "idempotency.key_hash";
/// Attribute: the door (`plain`, `celery`, `sqs`, `rust`…).
pub const ATTR_DOOR: &str = "idempotency.door";
/// Attribute: the claim's attempt number (claims made on the record, this one included),
/// when the delivery claimed.
pub const ATTR_ATTEMPT: &str = "idempotency.attempt";
/// Attribute: the record's duplicate count, for a repeat.
pub const ATTR_DUPLICATES: &str = "idempotency.duplicates";
/// Attribute: whether a stored result was kept (`store_result`), when one was asked.
pub const ATTR_RESULT_STORED: &str = "idempotency.result_stored";

/// The label of a producer's push dropped before it reached the queue because its
/// operation is already completed (`on_enqueue: skip_completed`): not a delivery, but
/// the same vocabulary, so a dashboard counts it beside the repeats.
pub const REJECTED_AT_ENQUEUE: &str = "rejected_at_enqueue";

/// Every label [`outcome_label`] answers, in the order a delivery may meet them, then
/// [`REJECTED_AT_ENQUEUE`] (a producer's, not a delivery's). None is an error.
pub const OUTCOMES: [&str; 10] = [
    "ran",
    "reclaimed",
    "replayed",
    "waited",
    "skipped",
    "in_progress",
    "held",
    "given_up",
    "refused",
    REJECTED_AT_ENQUEUE,
];

/// The label of a delivery's outcome: `ran` (the body ran under a first or retry claim,
/// after a wait too), `reclaimed` (it ran under a takeover of a stale claim),
/// `replayed` (a repeat of a completed operation answered with the stored result),
/// `waited` (a repeat that waited for the running call (`wait=`) and then found it
/// completed), `skipped` (a repeat of a completed operation with no stored value),
/// `in_progress` (a live claim: deferred, after a wait that ran out too), `held`,
/// `given_up`, `refused` (a different payload under `on_mismatch: raise`).
/// `decision` is `protocol::Decision::as_str`'s name, `replayed` whether the
/// value is the first run's stored result, `claim_kind` the claim's
/// [`crate::record::ClaimKind::as_str`] when the delivery claimed, `waited` whether it
/// waited for a live claim first (`protocol::Outcome::waited`).
pub fn outcome_label(
    decision: &str,
    replayed: bool,
    claim_kind: Option<&str>,
    waited: bool,
) -> &'static str {
    match decision {
        "ran" if claim_kind == Some("takeover") => "reclaimed",
        "ran" => "ran",
        "completed" if waited => "waited",
        "completed" if replayed => "replayed",
        "completed" => "skipped",
        "in_progress" => "in_progress",
        "held" => "held",
        "given_up" => "given_up",
        _ => "refused",
    }
}

/// The operation key as a span carries it: the first 16 hex characters of the SHA-256 of
/// `job_type`, a NUL and the key's text (the same key of two job types hashes apart; a
/// person with the key can find its spans, a reader of spans cannot recover it).
pub fn key_hash(job_type: &str, operation_key: &str) -> String {
    let mut hex = digest_text(&format!("{job_type}\0{operation_key}"));
    hex.truncate(16);
    hex
}

/// A span attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    /// A string.
    Text(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

/// What a binding reports about one delivery for its span.
#[derive(Debug, Clone, Default)]
pub struct Delivered<'a> {
    /// The door's name (`plain`, `celery`, `sqs`, `rust`).
    pub door: &'a str,
    /// The job type.
    pub job_type: &'a str,
    /// The operation key's text.
    pub operation_key: &'a str,
    /// `protocol::Decision::as_str`'s name.
    pub decision: &'a str,
    /// The value is the first run's stored result.
    pub replayed: bool,
    /// The delivery waited for a live claim first (`protocol::Outcome::waited`).
    pub waited: bool,
    /// The claim's kind name, when the delivery claimed.
    pub claim_kind: Option<&'a str>,
    /// The claim's attempt, when the delivery claimed.
    pub attempt: Option<i32>,
    /// The duplicate count, for a repeat.
    pub duplicates: Option<i32>,
    /// `stored`, `too_large`, `unencodable`; `None`: no store asked.
    pub result_state: Option<&'a str>,
}

/// The span's name for `job_type`: `idempotency <job type>`.
pub fn span_name(job_type: &str) -> String {
    format!("{SPAN_PREFIX} {job_type}")
}

/// The attributes of a delivery's span, in a fixed order. Every outcome here is not an
/// error: the span's status is OK (a body's raised error is the binding's to record).
pub fn span_attributes(d: &Delivered<'_>) -> Vec<(&'static str, AttrValue)> {
    let mut out = vec![
        (
            ATTR_OUTCOME,
            AttrValue::Text(outcome_label(d.decision, d.replayed, d.claim_kind, d.waited).into()),
        ),
        (ATTR_JOB_TYPE, AttrValue::Text(d.job_type.into())),
        (
            ATTR_KEY_HASH,
            AttrValue::Text(key_hash(d.job_type, d.operation_key)),
        ),
        (ATTR_DOOR, AttrValue::Text(d.door.into())),
    ];
    if let Some(attempt) = d.attempt {
        out.push((ATTR_ATTEMPT, AttrValue::Int(attempt.into())));
    }
    if let Some(duplicates) = d.duplicates {
        out.push((ATTR_DUPLICATES, AttrValue::Int(duplicates.into())));
    }
    if let Some(state) = d.result_state {
        out.push((ATTR_RESULT_STORED, AttrValue::Bool(state == "stored")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_has_a_label_and_the_key_is_hashed_per_job_type() {
        let labels: Vec<_> = [
            ("ran", false, Some("first"), false),
            ("ran", false, Some("takeover"), false),
            ("completed", true, None, false),
            ("completed", true, None, true),
            ("completed", false, None, false),
            ("in_progress", false, None, false),
            ("held", false, None, false),
            ("given_up", false, None, false),
            ("refused", false, None, false),
        ]
        .iter()
        .map(|(d, r, k, w)| outcome_label(d, *r, *k, *w))
        .chain([REJECTED_AT_ENQUEUE])
        .collect();
        assert_eq!(labels, OUTCOMES);
        assert_eq!(outcome_label("ran", false, Some("retry"), true), "ran");
        assert_eq!(outcome_label("completed", false, None, true), "waited");
        assert_eq!(key_hash("A", "42").len(), 16);
        assert_ne!(key_hash("A", "42"), key_hash("B", "42"));
    }
}
