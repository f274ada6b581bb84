//! `idempotent_job._native`: the PyO3 layer of the Python package, over
//! `idempotent_job_core`. Internal: the public API is the Python package
//! (`python/idempotent_job/__init__.py`). Every call copies its arguments into owned
//! Rust values, then runs the core with the GIL released (`gil::detached`), so other
//! Python threads run meanwhile and Ctrl-C or Celery's soft time limit interrupt it.
//!
//! One file per concern: `store` (configuration, migrations, operating calls),
//! `protocol` (a delivery: claim, run, complete or release), `errors` (core errors
//! → `idempotent_job.errors`), `gil` (releasing the GIL, interruptibly), `convert`
//! (Python values → JSON), `rules` (the core's checks and words as module functions).

mod convert;
mod errors;
mod gil;
mod protocol;
mod rules;
mod store;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<protocol::Claim>()?;
    m.add_class::<protocol::Outcome>()?;
    m.add_class::<protocol::JobProtocol>()?;
    m.add_function(wrap_pyfunction!(rules::describe_url, m)?)?;
    m.add_function(wrap_pyfunction!(errors::error_table_json, m)?)?;
    m.add_function(wrap_pyfunction!(errors::error_example, m)?)?;
    m.add_function(wrap_pyfunction!(errors::key_refusal, m)?)?;
    m.add_function(wrap_pyfunction!(errors::deferrals_refusal, m)?)?;
    m.add(
        "MAX_DEFERRALS",
        idempotent_job_core::protocol::MAX_DEFERRALS,
    )?;
    m.add_function(wrap_pyfunction!(convert::key_declaration, m)?)?;
    m.add_function(wrap_pyfunction!(convert::declared_key, m)?)?;
    m.add_function(wrap_pyfunction!(store::check_option_py, m)?)?;
    m.add_function(wrap_pyfunction!(rules::not_taken, m)?)?;
    m.add_function(wrap_pyfunction!(rules::args_digest, m)?)?;
    m.add_function(wrap_pyfunction!(rules::repeats_report, m)?)?;
    m.add_function(wrap_pyfunction!(protocol::span_attributes, m)?)?;
    m.add_function(wrap_pyfunction!(protocol::span_name, m)?)?;
    m.add("TRACER_NAME", idempotent_job_core::telemetry::TRACER_NAME)?;
    m.add_function(wrap_pyfunction!(rules::unreachable_delay, m)?)?;
    m.add_function(wrap_pyfunction!(rules::claim_error_report, m)?)?;
    m.add_function(wrap_pyfunction!(rules::delivery_count, m)?)?;
    m.add_function(wrap_pyfunction!(rules::check_wait, m)?)?;
    m.add_function(wrap_pyfunction!(rules::check_time, m)?)?;
    m.add(
        "CLAIM_ERROR_LOG_INTERVAL",
        idempotent_job_core::protocol::CLAIM_ERROR_LOG_INTERVAL,
    )?;
    // The job options this package takes (the core's table, unprefixed, in its order).
    m.add(
        "OPTION_NAMES",
        pyo3::types::PyTuple::new(m.py(), store::option_names())?,
    )?;
    // The default `retention` setting, seconds (the core's).
    m.add(
        "DEFAULT_RETENTION",
        idempotent_job_core::config::DEFAULT_RETENTION_SECONDS,
    )?;
    // The operating calls' defaults (the core's): held's limit, purge's batch, how far
    // back repeats looks (seconds) and its restart window (seconds).
    m.add(
        "DEFAULT_HELD_LIMIT",
        idempotent_job_core::operations::DEFAULT_HELD_LIMIT,
    )?;
    m.add(
        "DEFAULT_PURGE_BATCH",
        idempotent_job_core::operations::DEFAULT_PURGE_BATCH,
    )?;
    m.add(
        "DEFAULT_REPEATS_SINCE",
        idempotent_job_core::operations::DEFAULT_REPEATS_SINCE_SECONDS,
    )?;
    m.add(
        "DEFAULT_RESTART_WINDOW",
        idempotent_job_core::repeats::DEFAULT_RESTART_WINDOW,
    )?;
    m.add("SCHEMA_SQL", idempotent_job_core::migrate::schema_sql())?;
    // The core's value limits: levels of nesting, an integer's digits, and how messages
    // name a value over the nesting limit.
    m.add("MAX_NESTING", idempotent_job_core::canonical::MAX_NESTING)?;
    m.add(
        "MAX_INTEGER_DIGITS",
        idempotent_job_core::canonical::MAX_INTEGER_DIGITS,
    )?;
    m.add("TOO_DEEP", idempotent_job_core::canonical::too_deep())?;
    // The package's version: the Cargo workspace's, the one owner of it.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
