//! Core errors → Python exceptions. The classes are defined in Python
//! (`idempotent_job/errors.py`, one base `IdempotentJobError`, the same subclasses as
//! Ruby's `lib/idempotent_job/errors.rb`), looked up by name when an error is raised.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use idempotent_job_core::error::Error;

/// The name of the Python class in `idempotent_job.errors` for a core error: the
/// core's name for it ([`Error::class_name`], one name for every binding), the base
/// being `IdempotentJobError` in Python.
fn class_name(err: &Error) -> &'static str {
    match err.class_name() {
        "Error" => "IdempotentJobError",
        name => name,
    }
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let errors = py.import("idempotent_job.errors")?;
    let class = errors.getattr(class_name(err))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("sqlstate", err.sqlstate())?;
    kwargs.set_item("retryable", err.retryable())?;
    kwargs.set_item("sends_back", err.sends_back())?;
    if let Error::LostClaim {
        job_type,
        operation_key,
        ..
    }
    | Error::PayloadMismatch {
        job_type,
        operation_key,
        ..
    }
    | Error::Lookup {
        job_type,
        operation_key,
        ..
    } = err
    {
        kwargs.set_item("job_type", job_type)?;
        kwargs.set_item("operation_key", operation_key)?;
    }
    let exception = class.call((err.to_string(),), Some(&kwargs))?;
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
