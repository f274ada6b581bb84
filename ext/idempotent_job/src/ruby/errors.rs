//! Core errors → Ruby exceptions. The classes are defined in Ruby
//! (`lib/idempotent_job/errors.rb`, loaded before the native library), looked up
//! once when the library loads ([`init`]) and kept in statics.

use magnus::value::Lazy;
use magnus::{prelude::*, Exception, ExceptionClass, IntoValue, RModule, Ruby, Value};

use idempotent_job_core::error::{Error, Remedy};

/// The class `IdempotentJob::<name>`; [`init`] has checked that it exists.
fn lookup(ruby: &Ruby, name: &str) -> Result<ExceptionClass, magnus::Error> {
    let root: RModule = ruby.class_object().const_get("IdempotentJob")?;
    root.const_get(name)
}

macro_rules! classes {
    ($($stat:ident => $name:literal),* $(,)?) => {
        $(static $stat: Lazy<ExceptionClass> =
            Lazy::new(|ruby| lookup(ruby, $name).expect(concat!("IdempotentJob::", $name)));)*

        /// Looks every exception class up once; fails (instead of panicking later)
        /// when `lib/idempotent_job/errors.rb` did not define one.
        pub fn init(ruby: &Ruby) -> Result<(), magnus::Error> {
            $(lookup(ruby, $name)?; Lazy::force(&$stat, ruby);)*
            Ok(())
        }
    };
}

classes! {
    BASE => "Error",
    CONFIGURATION => "ConfigurationError",
    CONNECTION => "ConnectionError",
    DATABASE => "DatabaseError",
    LOST_CLAIM => "LostClaimError",
    MIGRATION => "MigrationError",
    OPERATION_KEY => "OperationKeyError",
    LOCK_TIMEOUT => "LockTimeoutError",
    TIMEOUT => "TimeoutError",
    PAYLOAD_MISMATCH => "PayloadMismatchError",
    LOOKUP => "LookupError",
}

fn class(err: &Error) -> &'static Lazy<ExceptionClass> {
    match err {
        Error::Config(_) => &CONFIGURATION,
        Error::Connection { .. } => &CONNECTION,
        Error::Database { .. } => &DATABASE,
        Error::LostClaim { .. } => &LOST_CLAIM,
        Error::Migration(_) => &MIGRATION,
        Error::OperationKey(_) => &OPERATION_KEY,
        Error::LockTimeout { .. } => &LOCK_TIMEOUT,
        Error::Timeout { .. } => &TIMEOUT,
        Error::PayloadMismatch { .. } => &PAYLOAD_MISMATCH,
        Error::Lookup { .. } => &LOOKUP,
        Error::Interrupted | Error::Panic(_) => &BASE,
    }
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
    let exception: Exception = ruby
        .get_inner(class(err))
        .new_instance((err.worded(remedy),))?;
    set(exception, "@sqlstate", err.sqlstate())?;
    set(exception, "@retryable", err.retryable())?;
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
