//! The one error type of the native core. Every fallible core function returns
//! [`Error`]; the Ruby layer maps each variant to one exception class under
//! `IdempotentJob::Error` (see `src/ruby/errors.rs`).

use std::fmt;

mod classes;
pub(crate) mod convert;
#[cfg(test)]
mod tests;

use classes::state_matches;
pub use classes::{
    error_class, error_table_json, example, is_transient_state, ErrorClass, Remedy, DRIFTED,
    ERROR_CLASSES, TRANSIENT_STATES,
};

/// Everything that can fail in the core.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// Invalid configuration or argument (bad URL, unknown key, non-positive lease…).
    /// Raised as `IdempotentJob::ConfigurationError`. Never contains a password.
    Config(String),
    /// A record the database holds but the core cannot read: a value no Rust type (nor
    /// any binding's) holds, such as a time edited by hand to `'infinity'` (or a claim's
    /// lease edited to end at `'infinity'`, met by a delivery). Names the
    /// record (when readable) and the column; never retried (reading again reads the same
    /// value). Raised as `IdempotentJob::UnreadableRecordError`, a `ConfigurationError`,
    /// so a page can tell it from a refused argument.
    Unreadable(String),
    /// An operation key (or its declaration) the record cannot hold: invalid UTF-8,
    /// a NUL character, too long, empty. Names the job. Raised as
    /// `IdempotentJob::OperationKeyError`; the job body is not run.
    OperationKey(String),
    /// The database could not be reached, the connection was lost, or no pooled
    /// connection became free in time. Retryable. `IdempotentJob::ConnectionError`.
    Connection {
        /// What failed, in words for the person reading the log.
        message: String,
        /// PostgreSQL's SQLSTATE, when the failure came from the server.
        sqlstate: Option<String>,
    },
    /// PostgreSQL answered with an error. `message` is PostgreSQL's own text (plus
    /// its detail and hint), `sqlstate` its five-character code.
    /// `IdempotentJob::DatabaseError`.
    Database {
        /// PostgreSQL's text, with its detail and hint.
        message: String,
        /// PostgreSQL's five-character SQLSTATE.
        sqlstate: String,
    },
    /// A completion or release found that the claim token no longer matches: the
    /// claim was taken over by another delivery after its lease ran out.
    /// `IdempotentJob::LostClaimError`.
    LostClaim {
        /// The job type of the operation's record.
        job_type: String,
        /// The operation key of the record.
        operation_key: String,
        /// The whole message, naming the job type and the operation key.
        message: String,
    },
    /// A configured timeout ran out: connecting (`connect_timeout`), waiting for a
    /// pooled connection (`checkout_timeout`) or a statement (`statement_timeout`,
    /// SQLSTATE 57014). Retryable. `IdempotentJob::TimeoutError`.
    Timeout {
        /// Which timeout ran out, and after how long.
        message: String,
        /// The server's SQLSTATE (`57014` for a statement timeout); `None` for a
        /// client-side timeout.
        sqlstate: Option<String>,
    },
    /// A delivery's payload differs from its claim's (same operation key) and the job
    /// refuses mismatches (`on_mismatch: raise`); the body was not run.
    /// `IdempotentJob::PayloadMismatchError`.
    PayloadMismatch {
        /// The job type of the operation's record.
        job_type: String,
        /// The operation key of the record.
        operation_key: String,
        /// The whole message, naming the job type and the operation key.
        message: String,
    },
    /// A stale claim's lookup raised or gave an answer other than done, not done or
    /// unknown; the claim's lease was ended so the next delivery asks again, the body
    /// was not run. `IdempotentJob::LookupError`.
    Lookup {
        /// The job type of the operation's record.
        job_type: String,
        /// The operation key of the record.
        operation_key: String,
        /// The whole message, naming the job type and the operation key.
        message: String,
    },
    /// A lock wait ran past its bound (SQLSTATE 55P03): another delivery of the same
    /// operation holds its transaction open. Retryable. `IdempotentJob::LockTimeoutError`.
    LockTimeout {
        /// PostgreSQL's text, or the core's naming the operation and the wait.
        message: String,
    },
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

/// How every refusal of a delivery before anything is claimed ends, after "the job "
/// (or the host's word for a job: Celery's "task"): nothing ran, nothing was written
/// (`keys::refusal`, the delivery checks of `record.rs`, `canonical::unwritable`).
pub const NOT_RUN: &str = "was not run and nothing was recorded";

/// The words that start the error of a claim that failed: `cannot claim {job_type}
/// operation {operation_key:?}` (the key quoted as Rust debug-formats a string).
pub fn claim_failure(job_type: &str, operation_key: &str) -> String {
    format!("cannot claim {job_type} operation {operation_key:?}")
}

/// Shorthand for results of core functions.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The name of the error's class in every binding (Ruby's `IdempotentJob::<name>`,
    /// Python's `idempotent_job.<name>`): one of [`ERROR_CLASSES`], `"Error"` (the
    /// base) for an interrupt or a panic.
    pub fn class_name(&self) -> &'static str {
        match self {
            Error::Config(_) => "ConfigurationError",
            Error::Unreadable(_) => "UnreadableRecordError",
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

    /// The attributes the core sets on the raised exception beyond its message,
    /// `sqlstate` and `retryable`: `job_type` and `operation_key` for the errors that
    /// name a record (their class's [`ErrorClass::attributes`]); none for the others.
    pub fn attributes(&self) -> Vec<(&'static str, &str)> {
        match self {
            Error::LostClaim {
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
            } => vec![
                ("job_type", job_type.as_str()),
                ("operation_key", operation_key.as_str()),
            ],
            _ => Vec::new(),
        }
    }

    /// The remedies the error's text points to, for the binding to word in its own
    /// language after the text: [`Remedy::Migrate`] for a missing table (42P01) or
    /// missing columns (42703, then also [`Remedy::SchemaSql`]); [`Remedy::SchemaSql`]
    /// for a migration that found the table drifted ([`DRIFTED`]). None otherwise.
    pub fn remedies(&self) -> &'static [Remedy] {
        match self {
            Error::Database { sqlstate, .. } if sqlstate == "42P01" => &[Remedy::Migrate],
            Error::Database { sqlstate, .. } if sqlstate == "42703" => {
                &[Remedy::Migrate, Remedy::SchemaSql]
            }
            Error::Migration(m) if m.contains(DRIFTED) => &[Remedy::SchemaSql],
            _ => &[],
        }
    }

    /// The error's text with each of its [`Error::remedies`] after it, in parentheses,
    /// as the binding words it (`word`).
    pub fn worded(&self, word: impl Fn(Remedy) -> &'static str) -> String {
        let mut text = self.to_string();
        for r in self.remedies() {
            text.push_str(&format!(" ({})", word(*r)));
        }
        text
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
            Error::Database { sqlstate, .. } => is_transient_state(sqlstate),
            _ => error_class(self.class_name()).is_some_and(|c| c.always_retryable),
        }
    }

    /// Whether a delivery whose claim failed with this error before its body ran goes
    /// back to its queue (with the protocol's `unreachable_delay` back-off) rather
    /// than failing: true when a change outside the delivery can let the same claim
    /// succeed later — PostgreSQL unreachable or slow ([`Error::Connection`],
    /// [`Error::Timeout`], [`Error::LockTimeout`]), any answer of the server
    /// ([`Error::Database`]: a wrong database name, role or password, a missing table
    /// before `migrate`), a failed migration, a lookup that raised. False for what only
    /// a different delivery or code can fix (a bad operation key, a payload mismatch
    /// refused by policy, a bad option or setting, a lost claim, an interrupt or panic).
    /// Every door whose queue drops a failed delivery (Celery acknowledges it, SQS
    /// deletes none but counts receives) reads this one rule: its class's
    /// [`ErrorClass::sends_back`] in [`ERROR_CLASSES`].
    pub fn sends_back(&self) -> bool {
        error_class(self.class_name()).is_some_and(|c| c.sends_back)
    }

    /// The error for a PostgreSQL error answer with SQLSTATE `code` and text `message`
    /// (its primary message, detail and hint), whichever driver received it: 55P03 is
    /// a [`Error::LockTimeout`], 57014 a [`Error::Timeout`] (statement_timeout), a
    /// connection state (see [`ERROR_CLASSES`]) a [`Error::Connection`], anything
    /// else a [`Error::Database`] (retryable for [`is_transient_state`]). 42P01 and
    /// 25006 get a hint saying what to do.
    pub fn from_server(code: &str, mut message: String) -> Self {
        if code == "42P01" {
            message.push_str(" (the idempotency record table is missing: apply the migrations)");
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
        let specific = |c: &&ErrorClass| !c.sqlstates.contains(&"*");
        let class = (ERROR_CLASSES.iter().filter(specific))
            .chain(ERROR_CLASSES.iter())
            .find(|c| state_matches(code, c.sqlstates))
            .map_or("DatabaseError", |c| c.name);
        let code = code.to_string();
        match class {
            "LockTimeoutError" => Error::LockTimeout { message },
            "TimeoutError" => Error::Timeout {
                message: format!("{message} (statement_timeout)"),
                sqlstate: Some(code),
            },
            "ConnectionError" => Error::Connection {
                message,
                sqlstate: Some(code),
            },
            _ => Error::Database {
                message,
                sqlstate: code,
            },
        }
    }

    /// The error, raised by the claim of `job_type`'s `operation_key`, naming the
    /// delivery: a connection, database or timeout error (a wrong role or password, a
    /// database that does not exist, PostgreSQL unreachable…) gets [`claim_failure`]'s
    /// words and `": "` before its text, once (an error that already starts with them,
    /// such as `schema::ensure`'s, is left as it is). Its class, SQLSTATE,
    /// [`Error::retryable`] and [`Error::sends_back`] do not change; every other error
    /// is returned unchanged.
    pub fn naming_claim(self, job_type: &str, operation_key: &str) -> Self {
        let what = claim_failure(job_type, operation_key);
        let named = |message: String| {
            if message.starts_with(&what) {
                message
            } else {
                format!("{what}: {message}")
            }
        };
        match self {
            Error::Connection { message, sqlstate } => Error::Connection {
                message: named(message),
                sqlstate,
            },
            Error::Database { message, sqlstate } => Error::Database {
                message: named(message),
                sqlstate,
            },
            Error::Timeout { message, sqlstate } => Error::Timeout {
                message: named(message),
                sqlstate,
            },
            other => other,
        }
    }

    /// A connection error with no SQLSTATE.
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
            Error::Config(m)
            | Error::Unreadable(m)
            | Error::OperationKey(m)
            | Error::Migration(m) => f.write_str(m),
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
