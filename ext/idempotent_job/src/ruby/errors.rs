//! Core errors → Ruby exceptions. The classes are defined in Ruby
//! (`lib/idempotent_job/errors.rb`, loaded before the native library); [`init`] checks
//! that every class of the core's table ([`ERROR_CLASSES`]) exists, and an error is
//! raised as the class its [`Error::class_name`] names.

use magnus::{prelude::*, Exception, ExceptionClass, IntoValue, RModule, Ruby, Value};

use idempotent_job_core::error::{Error, Remedy, ERROR_CLASSES};

/// The class `IdempotentJob::<name>`.
fn lookup(ruby: &Ruby, name: &str) -> Result<ExceptionClass, magnus::Error> {
    let root: RModule = ruby.class_object().const_get("IdempotentJob")?;
    root.const_get(name)
}

/// Checks that `lib/idempotent_job/errors.rb` defined every class of the core's table;
/// fails (instead of at the first error raised) when one is missing.
pub fn init(ruby: &Ruby) -> Result<(), magnus::Error> {
    for class in ERROR_CLASSES {
        lookup(ruby, class.name)?;
    }
    Ok(())
}

fn set<T: IntoValue>(exception: Exception, name: &str, value: T) -> Result<(), magnus::Error> {
    let _: Value = exception.funcall("instance_variable_set", (name, value))?;
    Ok(())
}

/// How the gem words a remedy the core names ([`Error::remedies`]).
fn remedy(remedy: Remedy) -> &'static str {
    match remedy {
        Remedy::Migrate => "run `rake idempotent_job:migrate` or IdempotentJob.migrate!",
        Remedy::SchemaSql => "`rake idempotent_job:sql` prints the table's statements",
    }
}

fn build(ruby: &Ruby, err: &Error) -> Result<Exception, magnus::Error> {
    let exception: Exception =
        lookup(ruby, err.class_name())?.new_instance((err.worded(remedy),))?;
    set(exception, "@sqlstate", err.sqlstate())?;
    set(exception, "@retryable", err.retryable())?;
    set(exception, "@sends_back", err.sends_back())?;
    for (name, value) in err.attributes() {
        set(exception, &format!("@{name}"), value)?;
    }
    Ok(exception)
}

/// `Native.error_table_json` → the core's error table as JSON text
/// ([`idempotent_job_core::error::error_table_json`]): what `lib/idempotent_job/errors.rb`'s
/// classes are checked against.
pub fn error_table_json() -> String {
    idempotent_job_core::error::error_table_json().to_string()
}

/// The Ruby exception for a core error (or the error met while building it).
pub fn to_ruby(ruby: &Ruby, err: Error) -> magnus::Error {
    build(ruby, &err).map_or_else(|e| e, magnus::Error::from)
}

/// `Native.server_error(sqlstate, message)` → the exception (not raised) the native
/// path raises for a PostgreSQL error answer with that SQLSTATE
/// ([`Error::from_server`]: its class, `sqlstate` and `retryable?`), or for a lost
/// connection when `sqlstate` is nil. For the gem's statements sent through another
/// driver (the ActiveRecord transactional path), so they fail as the native ones do.
pub fn server_error(
    ruby: &Ruby,
    sqlstate: Option<String>,
    message: String,
) -> Result<Exception, magnus::Error> {
    let err = match sqlstate {
        Some(code) => Error::from_server(&code, message),
        None => Error::connection(message),
    };
    build(ruby, &err)
}

/// `Native.error_example(name)` → an exception (not raised) of the class `name` built
/// from the core's example ([`idempotent_job_core::error::example`]) through the same
/// mapping every native error takes, or nil for a name not in the table. For the spec
/// that walks the table.
pub fn error_example(ruby: &Ruby, name: String) -> Result<Option<Exception>, magnus::Error> {
    idempotent_job_core::error::example(&name)
        .map(|err| build(ruby, &err))
        .transpose()
}
