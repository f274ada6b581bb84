//! The core's rules as module functions of `idempotent_job._native`, each the core's
//! check or wording with Python's values read in: option keywords not taken, the payload
//! digest, the repeats report, delays, delivery counts, `wait` and report times, the
//! claim error log's rate, a URL described without its password. Internal: the public
//! API is `idempotent_job/__init__.py` and the doors.

use pyo3::prelude::*;

use crate::convert;
use crate::errors::config;
use idempotent_job_core::{options, repeats};

/// `not_taken(job, call, name, known)` → raises the core's `ConfigurationError` for a
/// keyword `call` does not take ([`options::not_taken`], the Ruby gem's wording): names
/// `job`, `call`, the keyword, the nearest of `known` and all of them.
#[pyfunction]
pub fn not_taken(job: &str, call: &str, name: &str, known: Vec<String>) -> PyResult<()> {
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    Err(crate::errors::to_py(options::not_taken(
        job, call, name, name, &known, "",
    )))
}

/// `args_digest(value)` → the payload digest of a JSON value (the core's
/// `canonical::digest`: hex SHA-256 of its canonical JSON), as a claim stores it and
/// the Ruby gem computes it. Raises `ConfigurationError` for a value JSON cannot carry.
#[pyfunction]
pub fn args_digest(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let json = convert::to_json(value)
        .map_err(|what| config(format!("args_digest: the value holds {what}")))?;
    Ok(idempotent_job_core::canonical::digest(&json))
}

/// `repeats_report(operations_json)` → JSON object text: the repeats report of
/// operations given as a JSON array (what `Store.repeats` returns), by the core
/// ([`repeats::report_of_json`]): `notes`, `summary`, `producer_pairs`, `lines` and
/// `csv`, the text the Ruby gem's `rake idempotent_job:repeats` prints. Raises
/// `ConfigurationError` for text that is not JSON of that shape.
#[pyfunction]
pub fn repeats_report(operations_json: &str) -> PyResult<String> {
    repeats::report_of_json(operations_json)
        .map(|report| report.to_string())
        .map_err(crate::errors::to_py)
}

/// `unreachable_delay(failures)` → seconds (float) before a delivery whose claim failed
/// with a retryable error comes back: the core's `protocol::unreachable_delay` (1 s
/// doubling per earlier such failure, at most 60 s). `failures`: the failures before
/// this one.
#[pyfunction]
pub fn unreachable_delay(failures: u32) -> f64 {
    idempotent_job_core::protocol::unreachable_delay(failures)
}

/// `delivery_count(job, what, value, first=0)` → the count a delivery carries in its
/// message (an int, or a str of decimal digits) by the core's rule
/// ([`idempotent_job_core::protocol::delivery_count`]: a whole number from `first` to
/// `first` + `MAX_DEFERRALS`). Raises `ConfigurationError` naming `job`, `what` (the
/// door's words for where the count is) and the value otherwise.
#[pyfunction]
#[pyo3(signature = (job, what, value, first=0))]
pub fn delivery_count(
    job: &str,
    what: &str,
    value: &Bound<'_, PyAny>,
    first: u32,
) -> PyResult<u64> {
    let text = convert::count_text(value);
    idempotent_job_core::protocol::delivery_count(
        job,
        what,
        text.as_deref(),
        &convert::shown(value),
        first,
    )
    .map_err(crate::errors::to_py)
}

/// `check_wait(job, value)` → `value` as float seconds once the core's wait rule takes
/// it ([`idempotent_job_core::results::check_wait`]: a number of seconds from 0 to ten
/// years). Raises `ConfigurationError` naming `job` and the value otherwise (a bool,
/// NaN, an int beyond the float range).
#[pyfunction]
pub fn check_wait(job: &str, value: &Bound<'_, PyAny>) -> PyResult<f64> {
    idempotent_job_core::results::check_wait(
        job,
        convert::seconds(value),
        Some(&convert::shown(value)),
    )
    .map_err(crate::errors::to_py)
}

/// `check_time(name, value)` → `value` (int or float epoch seconds) as float once the
/// core's report time rule takes it ([`repeats::check_time`]: years 1 to 9999). Raises
/// `ConfigurationError` naming `name`, the range and the value otherwise (NaN, an
/// infinity, an int beyond the float range, a bool).
#[pyfunction]
pub fn check_time(name: &str, value: &Bound<'_, PyAny>) -> PyResult<f64> {
    repeats::check_time(name, convert::seconds(value), &convert::shown(value))
        .map_err(crate::errors::to_py)
}

/// `claim_error_report(cause)` → None, or the number of claim failures of `cause` (a
/// short text: the error's class and SQLSTATE) not logged since the last error line:
/// the core's `protocol::claim_error_report` (a line the first time, then at most once
/// per `CLAIM_ERROR_LOG_INTERVAL` seconds per process).
#[pyfunction]
pub fn claim_error_report(cause: &str) -> Option<u64> {
    idempotent_job_core::protocol::claim_error_report(cause)
}

/// `describe_url(url)` → the URL described by its parts, never its password.
#[pyfunction]
pub fn describe_url(url: &str) -> String {
    idempotent_job_core::config::describe_url(url)
}
