//! The one error type of the native core. Every fallible core function returns
//! [`Error`]; the Ruby layer maps each variant to one exception class under
//! `IdempotentJob::Error` (see `src/ruby/errors.rs`).

use std::fmt;

/// Everything that can fail in the core.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// Invalid configuration or argument (bad URL, unknown key, non-positive lease…).
    /// Raised as `IdempotentJob::ConfigurationError`. Never contains a password.
    Config(String),
    /// An operation key (or its declaration) the record cannot hold: invalid UTF-8,
    /// a NUL character, too long, empty. Names the job. Raised as
    /// `IdempotentJob::OperationKeyError`; the job body is not run.
    OperationKey(String),
    /// The database could not be reached, the connection was lost, or no pooled
    /// connection became free in time. Retryable. `IdempotentJob::ConnectionError`.
    Connection {
        message: String,
        sqlstate: Option<String>,
    },
    /// PostgreSQL answered with an error. `message` is PostgreSQL's own text (plus
    /// its detail and hint), `sqlstate` its five-character code.
    /// `IdempotentJob::DatabaseError`.
    Database { message: String, sqlstate: String },
    /// A completion or release found that the claim token no longer matches: the
    /// claim was taken over by another delivery after its lease ran out.
    /// `IdempotentJob::LostClaimError`.
    LostClaim {
        job_type: String,
        operation_key: String,
        message: String,
    },
    /// A configured timeout ran out: connecting (`connect_timeout`), waiting for a
    /// pooled connection (`checkout_timeout`) or a statement (`statement_timeout`,
    /// SQLSTATE 57014). Retryable. `IdempotentJob::TimeoutError`.
    Timeout {
        message: String,
        sqlstate: Option<String>,
    },
    /// A delivery's payload differs from its claim's (same operation key) and the job
    /// refuses mismatches (`on_mismatch: raise`); the body was not run.
    /// `IdempotentJob::PayloadMismatchError`.
    PayloadMismatch {
        job_type: String,
        operation_key: String,
        message: String,
    },
    /// A stale claim's lookup raised or gave an answer other than done, not done or
    /// unknown; the claim's lease was ended so the next delivery asks again, the body
    /// was not run. `IdempotentJob::LookupError`.
    Lookup {
        job_type: String,
        operation_key: String,
        message: String,
    },
    /// A lock wait ran past its bound (SQLSTATE 55P03): another delivery of the same
    /// operation holds its transaction open. Retryable. `IdempotentJob::LockTimeoutError`.
    LockTimeout { message: String },
    /// Applying the migrations failed. `IdempotentJob::MigrationError`.
    Migration(String),
    /// The caller's thread was interrupted and its owner gave the call up (a Ruby
    /// exception is pending: `Thread#raise`, `Timeout`, `Thread#kill`). The Ruby
    /// layer raises that exception instead; this never reaches Ruby code.
    Interrupted,
    /// A Rust panic caught at the boundary; never unwinds into Ruby.
    /// `IdempotentJob::Error`.
    Panic(String),
}

/// Shorthand for results of core functions.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The name of the error's class in every binding (Ruby's `IdempotentJob::<name>`,
    /// Python's `idempotent_job.<name>`): `"ConfigurationError"`, `"ConnectionError"`,
    /// `"OperationKeyError"`, `"DatabaseError"`, `"LostClaimError"`, `"MigrationError"`, `"LockTimeoutError"`,
    /// `"TimeoutError"`, `"PayloadMismatchError"`, `"LookupError"`, or `"Error"` (the
    /// base: an interrupt, a panic).
    pub fn class_name(&self) -> &'static str {
        match self {
            Error::Config(_) => "ConfigurationError",
            Error::OperationKey(_) => "OperationKeyError",
            Error::Connection { .. } => "ConnectionError",
            Error::Database { .. } => "DatabaseError",
            Error::LostClaim { .. } => "LostClaimError",
            Error::Migration(_) => "MigrationError",
            Error::LockTimeout { .. } => "LockTimeoutError",
            Error::Timeout { .. } => "TimeoutError",
            Error::PayloadMismatch { .. } => "PayloadMismatchError",
            Error::Lookup { .. } => "LookupError",
            Error::Interrupted | Error::Panic(_) => "Error",
        }
    }

    /// The PostgreSQL SQLSTATE of the error, when the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Connection { sqlstate, .. } => sqlstate.as_deref(),
            Error::LockTimeout { .. } => Some("55P03"),
            Error::Timeout { sqlstate, .. } => sqlstate.as_deref(),
            Error::Database { sqlstate, .. } => Some(sqlstate),
            _ => None,
        }
    }

    /// Whether the same call may succeed when made again later: a lost or refused
    /// connection, a timeout, a lock wait, or a server answer of a transient state
    /// ([`is_transient_state`]: read-only during a failover, a serialization failure,
    /// a deadlock, out of resources). Raised to Ruby as `retryable?`.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Connection { .. } | Error::Timeout { .. } | Error::LockTimeout { .. } => true,
            Error::Database { sqlstate, .. } => is_transient_state(sqlstate),
            _ => false,
        }
    }

    /// Whether a delivery whose claim failed with this error before its body ran goes
    /// back to its queue (with [`crate::protocol::unreachable_delay`]'s back-off) rather
    /// than failing: true when a change outside the delivery can let the same claim
    /// succeed later — PostgreSQL unreachable or slow ([`Error::Connection`],
    /// [`Error::Timeout`], [`Error::LockTimeout`]), any answer of the server
    /// ([`Error::Database`]: a wrong database name, role or password, a missing table
    /// before `migrate`), a failed migration, a lookup that raised. False for what only
    /// a different delivery or code can fix (a bad operation key, a payload mismatch
    /// refused by policy, a bad option or setting, a lost claim, an interrupt or panic).
    /// Every door whose queue drops a failed delivery (Celery acknowledges it, SQS
    /// deletes none but counts receives) reads this one rule.
    pub fn sends_back(&self) -> bool {
        matches!(
            self,
            Error::Connection { .. }
                | Error::Timeout { .. }
                | Error::LockTimeout { .. }
                | Error::Database { .. }
                | Error::Migration(_)
                | Error::Lookup { .. }
        )
    }

    /// The error for a PostgreSQL error answer with SQLSTATE `code` and text `message`
    /// (its primary message, detail and hint), whichever driver received it: 55P03 is
    /// a [`Error::LockTimeout`], 57014 a [`Error::Timeout`] (statement_timeout), a
    /// connection state (`is_connection_state`) a [`Error::Connection`], anything
    /// else a [`Error::Database`] (retryable for [`is_transient_state`]). 42P01 and
    /// 25006 get a hint saying what to do.
    pub fn from_server(code: &str, mut message: String) -> Self {
        if code == "42P01" {
            message.push_str(
                " (the idempotency record table is missing: run `rake idempotent_job:migrate` \
                 or IdempotentJob.migrate!)",
            );
        }
        if code == "28P01" || code == "28000" {
            message
                .push_str(" (the database refused the URL's role or password: check database_url)");
        }
        if code == "3D000" {
            message.push_str(" (the URL names a database that does not exist: check database_url)");
        }
        if code == "25006" {
            message.push_str(
                " (the server is read-only: a failover in progress, or the URL reaches a \
                 standby; retryable)",
            );
        }
        let code = code.to_string();
        if code == "55P03" {
            Error::LockTimeout { message }
        } else if code == "57014" {
            Error::Timeout {
                message: format!("{message} (statement_timeout)"),
                sqlstate: Some(code),
            }
        } else if is_connection_state(&code) {
            Error::Connection {
                message,
                sqlstate: Some(code),
            }
        } else {
            Error::Database {
                message,
                sqlstate: code,
            }
        }
    }

    pub fn connection(message: impl Into<String>) -> Self {
        Error::Connection {
            message: message.into(),
            sqlstate: None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m) | Error::OperationKey(m) | Error::Migration(m) => f.write_str(m),
            Error::Connection { message, .. } => f.write_str(message),
            Error::Database { message, sqlstate } => write!(f, "{message} (SQLSTATE {sqlstate})"),
            Error::LostClaim { message, .. }
            | Error::PayloadMismatch { message, .. }
            | Error::Lookup { message, .. }
            | Error::LockTimeout { message }
            | Error::Timeout { message, .. } => f.write_str(message),
            Error::Interrupted => f.write_str("the call was interrupted"),
            Error::Panic(m) => write!(f, "panic in idempotent_job native code: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// SQLSTATE classes after which the connection is gone and a retry may succeed:
/// 08 connection exception, 57P01-57P03 server shutting down / cannot connect now,
/// 53300 too many connections.
fn is_connection_state(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
}

/// SQLSTATEs of a server answer that usually passes: 25006 read-only transaction (the
/// server became a standby in a failover, or a replica was reached), 40001
/// serialization failure, 40P01 deadlock, class 53 insufficient resources, 58000 /
/// 58030 system and I/O errors. Such an error is a [`Error::Database`] whose
/// [`Error::retryable`] is true.
pub fn is_transient_state(code: &str) -> bool {
    matches!(code, "25006" | "40001" | "40P01" | "58000" | "58030") || code.starts_with("53")
}

/// The full `source()` chain of an error, joined with ": ". tokio-postgres's own
/// `Display` says only "db error" or "error connecting to server".
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

impl From<tokio_postgres::Error> for Error {
    fn from(err: tokio_postgres::Error) -> Self {
        if let Some(db) = err.as_db_error() {
            let mut message = db.message().to_string();
            if let Some(detail) = db.detail() {
                message.push_str(&format!(" DETAIL: {detail}"));
            }
            if let Some(hint) = db.hint() {
                message.push_str(&format!(" HINT: {hint}"));
            }
            Error::from_server(db.code().code(), message)
        } else if timed_out(&err) {
            Error::Timeout {
                message: format!("{} (connect_timeout)", chain(&err)),
                sqlstate: None,
            }
        } else {
            let mut message = chain(&err);
            if message.contains("UnknownIssuer") {
                message.push_str(
                    " (the server's certificate is not signed by a trusted root: set sslrootcert \
                     to the CA that signed it)",
                );
            }
            Error::connection(message)
        }
    }
}

/// Whether an error's source chain holds an I/O time-out (tokio-postgres's connect
/// timeout).
fn timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        source = s.source();
    }
    false
}

impl From<refinery::Error> for Error {
    fn from(err: refinery::Error) -> Self {
        Error::Migration(format!("migration failed: {}", chain(&err)))
    }
}
