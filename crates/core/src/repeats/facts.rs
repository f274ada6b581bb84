//! Reading a delivery's facts: times in any of the doors' forms, ids, retry counts, and
//! Ruby's truthiness for facts a Ruby door recorded.

use chrono::DateTime;
use serde_json::Value;

use super::{Facts, MILLISECONDS_FROM};

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
pub(super) fn truthy(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !matches!(v, Value::Null | Value::Bool(false)))
}

/// A fact as text (a number's or other value's JSON text when it is not text).
pub(super) fn text(value: Option<&Value>) -> Option<String> {
    truthy(value).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// A fact as an integer, the way Ruby's `to_i` reads it (absent, null or not a number: 0).
pub(super) fn integer(value: Option<&Value>) -> i64 {
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
pub(super) fn id_of(facts: &Facts) -> Option<String> {
    ["jid", "job_id", "task_id", "delivery_id", "message_id"]
        .iter()
        .find_map(|k| text(facts.get(*k)))
}

pub(super) fn decision(facts: &Facts) -> Option<&str> {
    facts.get("decision").and_then(Value::as_str)
}

/// How many times the queue has retried this delivery: Sidekiq's `retry_count` is
/// absent before the first retry, then 0, 1…; ActiveJob's `executions` is 1, 2…;
/// Celery's `retries` is 0, 1….
pub(super) fn retries(facts: &Facts) -> i64 {
    if facts.contains_key("retry_count") {
        // saturating: a producer's retry_count may be i64::MAX (or a u64 read as such)
        return integer(facts.get("retry_count")).saturating_add(1);
    }
    if facts.contains_key("retries") {
        return integer(facts.get("retries"));
    }
    integer(facts.get("executions")).saturating_sub(1).max(0)
}

pub(super) fn number(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

pub(super) fn epoch(t: &DateTime<chrono::Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}
