//! Core errors → Ruby exceptions. The classes are defined in Ruby
//! (`lib/idempotent_job/errors.rb`, loaded before the native library) and looked up
//! by name when an error is raised.

use magnus::{prelude::*, Exception, ExceptionClass, IntoValue, RModule, Ruby, Value};

use crate::core::error::Error;

fn class_name(err: &Error) -> &'static str {
    match err {
        Error::Config(_) => "ConfigurationError",
        Error::Connection { .. } => "ConnectionError",
        Error::Database { .. } => "DatabaseError",
        Error::LostClaim { .. } => "LostClaimError",
        Error::Migration(_) => "MigrationError",
        Error::LockTimeout { .. } => "LockTimeoutError",
        Error::Timeout { .. } => "TimeoutError",
        Error::Panic(_) => "Error",
    }
}

fn set<T: IntoValue>(exception: Exception, name: &str, value: T) -> Result<(), magnus::Error> {
    let _: Value = exception.funcall("instance_variable_set", (name, value))?;
    Ok(())
}

fn build(ruby: &Ruby, err: &Error) -> Result<magnus::Error, magnus::Error> {
    let root: RModule = ruby.class_object().const_get("IdempotentJob")?;
    let class: ExceptionClass = root.const_get(class_name(err))?;
    let exception: Exception = class.new_instance((err.to_string(),))?;
    set(exception, "@sqlstate", err.sqlstate())?;
    set(exception, "@retryable", err.retryable())?;
    if let Error::LostClaim {
        job_type,
        operation_key,
        ..
    } = err
    {
        set(exception, "@job_type", job_type.as_str())?;
        set(exception, "@operation_key", operation_key.as_str())?;
    }
    Ok(exception.into())
}

/// The Ruby exception for a core error (or the error met while building it).
pub fn to_ruby(ruby: &Ruby, err: Error) -> magnus::Error {
    build(ruby, &err).unwrap_or_else(|e| e)
}
