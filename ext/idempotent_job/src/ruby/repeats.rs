//! `Native.classify_repeats`, `Native.repeat_deliveries`, `Native.repeat_row_deliveries`,
//! `Native.epoch_seconds` and `Native.repeats_report`: the repeats report's rules and
//! its summary and formatting, which live in the core ([`idempotent_job_core::repeats`]). Facts cross as JSON text (the doors record them
//! as JSON); Ruby's `Repeats::Classifier` and `Repeats::Report` build their Structs and
//! print the core's summary, text and CSV.

use idempotent_job_core::error::Error;
use idempotent_job_core::repeats::{self, Facts};
use magnus::{prelude::*, RArray, Ruby, Value};

use super::convert::Out;
use super::errors::to_ruby;

type RbResult<T> = Result<T, magnus::Error>;

/// JSON text holding delivery facts, read at the depth a claim accepted them (the core's
/// `MAX_NESTING`) with two levels of wrapping (a deliveries array; a repeats array's
/// element objects): [`idempotent_job_core::canonical::parse_nested`].
fn parse(ruby: &Ruby, what: &str, text: &str) -> RbResult<serde_json::Value> {
    idempotent_job_core::canonical::parse_nested(text, 2).map_err(|e| {
        to_ruby(
            ruby,
            Error::Config(format!("{what} must be JSON text: {e}")),
        )
    })
}

fn refused(ruby: &Ruby, what: &str) -> magnus::Error {
    to_ruby(
        ruby,
        Error::Config(format!("{what} must be JSON of that shape")),
    )
}

fn object(ruby: &Ruby, what: &str, value: serde_json::Value) -> RbResult<Facts> {
    match value {
        serde_json::Value::Object(m) => Ok(m),
        _ => Err(refused(ruby, what)),
    }
}

fn array(ruby: &Ruby, what: &str, value: serde_json::Value) -> RbResult<Vec<serde_json::Value>> {
    match value {
        serde_json::Value::Array(a) => Ok(a),
        _ => Err(refused(ruby, what)),
    }
}

/// `Native.classify_repeats(deliveries_json, completed_at, restarts, restart_window)` →
/// Array of Hashes (Symbol keys), one per delivery after the first:
/// [`idempotent_job_core::repeats::classify`]. `deliveries_json`: a JSON array of fact
/// objects in arrival order; `completed_at`: epoch seconds or nil; `restarts`: Array
/// of epoch seconds; `restart_window`: seconds. Each Hash: `at`, `after_claim`,
/// `after_enqueue`, `restart` (Float or nil), `id`, `producer`, `first_producer`,
/// `decision` (String or nil), `cause` (Symbol), `retry_count` (Integer or nil),
/// `live_claim`, `deferred_return` (Boolean).
///
/// `Native.restart_window(value)` → Float: a repeats report's `restart_window` in
/// seconds (an Integer, a Float, or 10.minutes, a Rational, a BigDecimal by their
/// `to_f`), checked by the core ([`repeats::check_window`]). Raises `ConfigurationError`
/// in the core's words ([`repeats::window_refused`], the value shown by `inspect`) for
/// anything else (`true`, `nil`, `"90"`: never read as a number by `to_f`).
pub fn restart_window(ruby: &Ruby, value: Value) -> RbResult<f64> {
    let number = super::options::number_of(value)?.unwrap_or(value);
    if !(number.is_kind_of(ruby.class_integer()) || number.is_kind_of(ruby.class_float())) {
        return Err(to_ruby(ruby, repeats::window_refused(&value.inspect())));
    }
    let seconds: f64 = number.funcall("to_f", ())?;
    repeats::check_window(seconds).map_err(|e| to_ruby(ruby, e))?;
    Ok(seconds)
}

/// Errors: `ConfigurationError` for text that is not a JSON array of objects, or a
/// negative or non-finite window.
pub fn classify_repeats(
    ruby: &Ruby,
    deliveries_json: String,
    completed_at: Option<f64>,
    restarts: Vec<f64>,
    restart_window: f64,
) -> RbResult<RArray> {
    repeats::check_window(restart_window).map_err(|e| to_ruby(ruby, e))?;
    let what = "the deliveries' facts (an array of objects)";
    let deliveries = array(ruby, what, parse(ruby, what, &deliveries_json)?)?
        .into_iter()
        .map(|d| object(ruby, what, d))
        .collect::<RbResult<Vec<Facts>>>()?;
    let classified = repeats::classify(&deliveries, completed_at, &restarts, restart_window);
    let out = ruby.ary_new_capa(classified.len());
    for r in classified {
        let hash = Out::new(ruby);
        hash.set("at", r.at)?
            .set("id", r.id)?
            .sym("cause", r.cause.name())?
            .set("after_claim", r.after_claim)?
            .set("after_enqueue", r.after_enqueue)?
            .set("retry_count", r.retry_count)?
            .set("producer", r.producer)?
            .set("first_producer", r.first_producer)?
            .set("live_claim", r.live_claim)?
            .set("deferred_return", r.deferred_return)?
            .set("restart", r.restart)?
            .set("decision", r.decision)?;
        out.push(hash.hash)?;
    }
    Ok(out)
}

/// `Native.repeat_deliveries(first_claimed_at, first_facts_json, repeat_facts_json)` →
/// JSON array text: an operation's deliveries
/// ([`idempotent_job_core::repeats::deliveries`]). `first_claimed_at`: epoch seconds;
/// `first_facts_json`: a JSON object text or nil; `repeat_facts_json`: the record's
/// repeat elements, a JSON array text.
///
/// Errors: `ConfigurationError` for text that is not JSON of that shape.
pub fn repeat_deliveries(
    ruby: &Ruby,
    first_claimed_at: f64,
    first_facts_json: Option<String>,
    repeat_facts_json: String,
) -> RbResult<String> {
    let what = "the first delivery's facts (an object)";
    let first = first_facts_json
        .map(|t| object(ruby, what, parse(ruby, what, &t)?))
        .transpose()?;
    let what = "the repeat elements (an array)";
    let elements = array(ruby, what, parse(ruby, what, &repeat_facts_json)?)?;
    let deliveries = repeats::deliveries(first_claimed_at, first, &elements);
    Ok(deliveries_json(deliveries))
}

/// `Native.repeat_row_deliveries(what, first_claimed_at, first_facts_json,
/// repeat_facts_json, repeat_times, claimed_once_id)` → JSON array text: a report
/// row's deliveries ([`idempotent_job_core::repeats::row_deliveries_of`]); times in
/// epoch seconds; `claimed_once_id`: the record's delivery id when it was claimed once,
/// else nil.
///
/// Errors: `ConfigurationError` naming `what` for JSON text that does not parse.
pub fn repeat_row_deliveries(
    ruby: &Ruby,
    what: String,
    first_claimed_at: f64,
    first_facts_json: Option<String>,
    repeat_facts_json: String,
    repeat_times: Vec<f64>,
    claimed_once_id: Option<String>,
) -> RbResult<String> {
    let deliveries = repeats::row_deliveries_of(
        &what,
        first_claimed_at,
        first_facts_json.as_deref(),
        &repeat_facts_json,
        &repeat_times,
        claimed_once_id.as_deref(),
    )
    .map_err(|e| to_ruby(ruby, e))?;
    Ok(deliveries_json(deliveries))
}

/// `Native.epoch_seconds(value_json)` → Float or nil: a JSON value (epoch seconds,
/// epoch milliseconds, ISO 8601 text) as epoch seconds
/// ([`idempotent_job_core::repeats::seconds`]); nil for anything else.
pub fn epoch_seconds(value_json: String) -> Option<f64> {
    serde_json::from_str(&value_json)
        .ok()
        .and_then(|v| repeats::seconds(&v))
}

/// `Native.repeat_causes` → Array of `[Symbol, label]` in report order
/// ([`idempotent_job_core::repeats::Cause::ALL`]).
pub fn repeat_causes(ruby: &Ruby) -> RbResult<RArray> {
    let out = ruby.ary_new();
    for cause in repeats::Cause::ALL {
        out.push((ruby.sym_new(cause.name()), cause.label()))?;
    }
    Ok(out)
}

/// `Native.repeats_report(operations_json)` → JSON object text: the report of the
/// operations ([`idempotent_job_core::repeats::report_of_json`]: `notes`, `summary`,
/// `producer_pairs`, `lines`, `csv`). `operations_json`: a JSON array of operations
/// (job_type, operation_key, status, takeovers, mismatches, replays, producers,
/// job_classes, repeats with their members; times in epoch seconds).
///
/// Errors: `ConfigurationError` for text that is not JSON of that shape.
pub fn repeats_report(ruby: &Ruby, operations_json: String) -> RbResult<String> {
    repeats::report_of_json(&operations_json)
        .map(|report| report.to_string())
        .map_err(|e| to_ruby(ruby, e))
}

/// Deliveries (JSON objects) as one JSON array text, the form both readers return.
fn deliveries_json(deliveries: Vec<serde_json::Map<String, serde_json::Value>>) -> String {
    serde_json::Value::Array(
        deliveries
            .into_iter()
            .map(serde_json::Value::Object)
            .collect(),
    )
    .to_string()
}
