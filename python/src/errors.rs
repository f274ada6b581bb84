//! Core errors → Python exceptions. The classes are defined in Python
//! (`idempotent_job/errors.py`, one base `IdempotentJobError`, the same subclasses as
//! Ruby's `lib/idempotent_job/errors.rb`), looked up by name when an error is raised.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use idempotent_job_core::error::{Error, Remedy};

/// The name of the Python class in `idempotent_job.errors` for a core error: the
/// core's name for it ([`Error::class_name`], one name for every binding), the base
/// being `IdempotentJobError` in Python.
fn class_name(err: &Error) -> &'static str {
    match err.class_name() {
        "Error" => "IdempotentJobError",
        name => name,
    }
}

/// How the package words a remedy the core names ([`Error::remedies`]).
fn remedy(remedy: Remedy) -> &'static str {
    match remedy {
        Remedy::Migrate => "run idempotent_job.migrate()",
        Remedy::SchemaSql => {
            "the statements are those of the migrations idempotent_job.migrate() applies"
        }
    }
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let errors = py.import("idempotent_job.errors")?;
    let class = errors.getattr(class_name(err))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("sqlstate", err.sqlstate())?;
    kwargs.set_item("retryable", err.retryable())?;
    kwargs.set_item("sends_back", err.sends_back())?;
    for (name, value) in err.attributes() {
        kwargs.set_item(name, value)?;
    }
    let exception = class.call((err.worded(remedy),), Some(&kwargs))?;
    Ok(PyErr::from_value(exception))
}

/// The Python exception for a core error (or the error met while building it).
pub fn to_py(err: Error) -> PyErr {
    Python::attach(|py| build(py, &err).unwrap_or_else(|e| e))
}

/// A `ConfigurationError` with `message` (bad arguments found by the binding).
pub fn config(message: impl Into<String>) -> PyErr {
    to_py(Error::Config(message.into()))
}

/// `error_table_json()` → the core's error table as JSON text
/// ([`idempotent_job_core::error::error_table_json`]): what `idempotent_job/errors.py`'s
/// classes are checked against.
#[pyfunction]
pub fn error_table_json() -> String {
    idempotent_job_core::error::error_table_json().to_string()
}

/// `error_example(name)` → an exception (not raised) of the class `name` built from the
/// core's example ([`idempotent_job_core::error::example`]) through the same mapping
/// every native error takes, or None for a name not in the table. For the test that
/// walks the table.
#[pyfunction]
pub fn error_example(py: Python<'_>, name: &str) -> PyResult<Option<Py<PyAny>>> {
    match idempotent_job_core::error::example(name) {
        Some(err) => Ok(Some(build(py, &err)?.into_value(py).into_any())),
        None => Ok(None),
    }
}

/// `key_refusal(job, problem, noun)` → the message of an operation key refused before
/// anything is claimed, worded by the core ([`idempotent_job_core::keys::refusal`]):
/// "<job>: <problem>; the <noun> was not run and nothing was recorded".
#[pyfunction]
pub fn key_refusal(job: &str, problem: &str, noun: &str) -> String {
    idempotent_job_core::keys::refusal(job, problem, noun)
}

/// `deferrals_refusal(job, subject, shown)` → the message of a delivery whose deferral
/// count is no count, worded by the core
/// ([`idempotent_job_core::protocol::deferrals_refused`], the Ruby gem's words too):
/// `subject` is the caller's name for the count, `shown` the value's `repr`.
#[pyfunction]
pub fn deferrals_refusal(job: &str, subject: &str, shown: &str) -> String {
    idempotent_job_core::protocol::deferrals_refused(job, subject, shown).to_string()
}

/// An operation key's text checked as finished ([`idempotent_job_core::keys::problem`]:
/// UTF-8, size, NUL), or the `OperationKeyError` naming `job` (its `job_type` and
/// `job_class`) for it or for `text`'s problem (a value that cannot be a key), worded by
/// the core ([`idempotent_job_core::keys::value_refusal`]: "<job>: operation key:
/// <problem>; the job was not run and nothing was recorded"). Shared by
/// `Store.operation_key` and `declared_key`.
pub fn checked_key(py: Python<'_>, job: &str, text: Result<String, String>) -> PyResult<String> {
    let problem = match text {
        Ok(text) => match idempotent_job_core::keys::problem(job.as_bytes(), text.as_bytes()) {
            None => return Ok(text),
            Some(problem) => problem,
        },
        Err(problem) => problem,
    };
    let class = py
        .import("idempotent_job.errors")?
        .getattr("OperationKeyError")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("job_class", job)?;
    kwargs.set_item("job_type", job)?;
    let message = idempotent_job_core::keys::value_refusal(job, &problem);
    Err(PyErr::from_value(class.call((message,), Some(&kwargs))?))
}
