//! An operation's deliveries, as [`super::classify`] reads them, from what its record keeps.

use serde_json::{Map, Value};

use super::facts::{epoch, number, seconds, truthy};
use super::{Facts, CLAIMED};
use crate::error::{Error, Result};
use crate::records::Repeated;

/// An operation's deliveries as [`classify`](super::classify) reads them, from what the record keeps:
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

/// A row of the report's SQL ([`crate::sql::REPEATS_SQL`]) as deliveries
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
    // The facts a claim accepted are nested up to MAX_NESTING levels; the repeats array
    // wraps each in an element object: read both at the depth the claim allowed.
    let parse = |text: &str, wrapping: usize| -> Result<Value> {
        crate::canonical::parse_nested(text, wrapping)
            .map_err(|e| Error::Config(format!("the repeats of {what} are not JSON: {e}")))
    };
    let mut elements = match parse(repeat_facts, 2)? {
        Value::Array(a) => a,
        _ => Vec::new(),
    };
    if elements.is_empty() {
        elements = repeat_times
            .iter()
            .map(|&t| Value::Object(Map::from_iter([("at".to_owned(), number(t))])))
            .collect();
    }
    let mut first = match first_facts.map(|f| parse(f, 0)).transpose()? {
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
