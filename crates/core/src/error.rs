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

/// One exception class as every binding defines it (Ruby's `IdempotentJob::<name>`,
/// Python's `idempotent_job.<name>`, the base being `IdempotentJobError` there): the
/// one table both languages' classes are checked against (`spec/idempotent_job/errors_spec.rb`,
/// `python/tests/test_errors.py`), read through [`error_table_json`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorClass {
    /// The class name in every binding (`"Error"`: the base).
    pub name: &'static str,
    /// The attributes the class carries beyond its message, `sqlstate` and `retryable`
    /// (set by the core from [`Error::attributes`], or by the host for the key's own).
    pub attributes: &'static [&'static str],
    /// Whether every instance is retryable (otherwise it is per error: a
    /// `DatabaseError` of a [`TRANSIENT_STATES`] answer is, the others are not).
    pub always_retryable: bool,
    /// The SQLSTATEs a server answer of this class has (`"08*"`: a whole class;
    /// `"*"`: any other, tried by [`Error::from_server`] after every specific one).
    pub sqlstates: &'static [&'static str],
    /// Whether a delivery whose claim failed with an error of this class before its body
    /// ran goes back to its queue rather than failing ([`Error::sends_back`]).
    pub sends_back: bool,
    /// One line saying when it is raised.
    pub doc: &'static str,
}

/// Attributes of the errors that name the record they concern.
const RECORD_ATTRIBUTES: &[&str] = &["job_type", "operation_key"];

/// Every exception class, the base first; [`Error::class_name`] names one of them.
pub const ERROR_CLASSES: &[ErrorClass] = &[
    ErrorClass {
        name: "Error",
        attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "the base of every error the library raises (also: a panic in native code)",
    },
    ErrorClass {
        name: "ConfigurationError",
        attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "invalid configuration or option: a bad URL, an unknown name, a value out of range",
    },
    ErrorClass {
        name: "ConnectionError",
        attributes: &[],
        always_retryable: true,
        sqlstates: &["08*", "57P01", "57P02", "57P03", "53300"],
        sends_back: true,
        doc: "PostgreSQL could not be reached or the connection was lost; the body did not run",
    },
    ErrorClass {
        name: "DatabaseError",
        attributes: &[],
        always_retryable: false,
        sqlstates: &["*"],
        sends_back: true,
        doc: "PostgreSQL answered with an error (retryable for a transient SQLSTATE)",
    },
    ErrorClass {
        name: "LostClaimError",
        attributes: RECORD_ATTRIBUTES,
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "a completion or release found its fencing token replaced: another delivery took over",
    },
    ErrorClass {
        name: "MigrationError",
        attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: true,
        doc: "applying the migrations failed; the migration's transaction was rolled back",
    },
    ErrorClass {
        name: "OperationKeyError",
        attributes: &["job_class", "declaration"],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "a malformed key declaration, or arguments that yield no operation key; the body did not run",
    },
    ErrorClass {
        name: "LockTimeoutError",
        attributes: &[],
        always_retryable: true,
        sqlstates: &["55P03"],
        sends_back: true,
        doc: "a lock wait ran past its bound: another delivery's transaction is open",
    },
    ErrorClass {
        name: "TimeoutError",
        attributes: &[],
        always_retryable: true,
        sqlstates: &["57014"],
        sends_back: true,
        doc: "a configured timeout ran out (connect, checkout, statement); nothing was decided",
    },
    ErrorClass {
        name: "PayloadMismatchError",
        attributes: RECORD_ATTRIBUTES,
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "a delivery's payload differs from its claim's and the job refuses mismatches",
    },
    ErrorClass {
        name: "LookupError",
        attributes: RECORD_ATTRIBUTES,
        always_retryable: false,
        sqlstates: &[],
        sends_back: true,
        doc: "a stale claim's lookup raised or gave no valid answer; the body did not run",
    },
];

/// SQLSTATEs of a server answer that usually passes: 25006 read-only transaction (the
/// server became a standby in a failover, or a replica was reached), 40001
/// serialization failure, 40P01 deadlock, class 53 insufficient resources, 58000 /
/// 58030 system and I/O errors. Such an error is a [`Error::Database`] whose
/// [`Error::retryable`] is true.
pub const TRANSIENT_STATES: &[&str] = &["25006", "40001", "40P01", "53*", "58000", "58030"];

/// Whether SQLSTATE `code` matches one of `patterns` (`"08*"`: the class 08).
fn state_matches(code: &str, patterns: &[&str]) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(head) => code.starts_with(head),
        None => code == *p,
    })
}

/// The class named `name` in [`ERROR_CLASSES`].
pub fn error_class(name: &str) -> Option<&'static ErrorClass> {
    ERROR_CLASSES.iter().find(|c| c.name == name)
}

/// The table as JSON, for bindings and their tests: a list in [`ERROR_CLASSES`]
/// order, each `{"name", "attributes", "always_retryable", "sqlstates", "sends_back",
/// "doc"}`, the
/// `DatabaseError` entry with `"retryable_sqlstates"` ([`TRANSIENT_STATES`]) too.
pub fn error_table_json() -> serde_json::Value {
    let classes = ERROR_CLASSES.iter().map(|c| {
        let mut entry = serde_json::json!({
            "name": c.name,
            "attributes": c.attributes,
            "always_retryable": c.always_retryable,
            "sqlstates": c.sqlstates,
            "sends_back": c.sends_back,
            "doc": c.doc,
        });
        if c.name == "DatabaseError" {
            entry["retryable_sqlstates"] = serde_json::json!(TRANSIENT_STATES);
        }
        entry
    });
    serde_json::Value::Array(classes.collect())
}

/// What a person does about an error, named by the core and worded by each binding in
/// its own language (Ruby: `rake idempotent_job:migrate`; Python:
/// `idempotent_job.migrate()`), so no host language appears in the core's texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// Apply the pending migrations.
    Migrate,
    /// Restore the table as the migrations' statements create it (print them).
    SchemaSql,
}

/// Put in a [`Error::Migration`] text that says the table drifted from the migrations
/// (its remedy is [`Remedy::SchemaSql`]).
pub const DRIFTED: &str = "has drifted";

/// An error of the class named `name` with every attribute the core sets, for a
/// binding's test that builds each class of [`ERROR_CLASSES`] through its own mapping
/// (`None` for a name not in the table).
pub fn example(name: &str) -> Option<Error> {
    let record = || {
        (
            "ExampleJob".to_string(),
            "order-1".to_string(),
            format!("an example {name}"),
        )
    };
    let (job_type, operation_key, message) = record();
    Some(match name {
        "Error" => Error::Panic(message),
        "ConfigurationError" => Error::Config(message),
        "OperationKeyError" => Error::OperationKey(message),
        "ConnectionError" => Error::connection(message),
        "DatabaseError" => Error::from_server("40001", message),
        "LostClaimError" => Error::LostClaim {
            job_type,
            operation_key,
            message,
        },
        "MigrationError" => Error::Migration(message),
        "LockTimeoutError" => Error::from_server("55P03", message),
        "TimeoutError" => Error::from_server("57014", message),
        "PayloadMismatchError" => Error::PayloadMismatch {
            job_type,
            operation_key,
            message,
        },
        "LookupError" => Error::Lookup {
            job_type,
            operation_key,
            message,
        },
        _ => return None,
    })
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

/// Whether SQLSTATE `code` is of an answer that usually passes ([`TRANSIENT_STATES`]).
pub fn is_transient_state(code: &str) -> bool {
    state_matches(code, TRANSIENT_STATES)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_in_the_table_has_an_example_of_its_own_class() {
        for class in ERROR_CLASSES {
            let err = example(class.name).unwrap();
            assert_eq!(err.class_name(), class.name);
            let names: Vec<&str> = err.attributes().iter().map(|(n, _)| *n).collect();
            if class.name != "OperationKeyError" {
                assert_eq!(names, class.attributes, "{}", class.name);
            }
            if class.always_retryable {
                assert!(err.retryable(), "{}", class.name);
            }
            assert_eq!(err.sends_back(), class.sends_back, "{}", class.name);
        }
        assert!(example("Nope").is_none());
    }

    #[test]
    fn server_answers_take_the_class_of_their_sqlstate() {
        let class = |code: &str| Error::from_server(code, "m".into()).class_name();
        assert_eq!(class("08006"), "ConnectionError");
        assert_eq!(class("53300"), "ConnectionError");
        assert_eq!(class("55P03"), "LockTimeoutError");
        assert_eq!(class("57014"), "TimeoutError");
        assert_eq!(class("23505"), "DatabaseError");
        assert!(Error::from_server("53100", "m".into()).retryable());
        assert!(Error::from_server("25006", "m".into()).retryable());
        assert!(!Error::from_server("23505", "m".into()).retryable());
    }

    /// Every `.rs` file under `dir`, recursively.
    fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn no_code_line_of_the_core_words_a_hosts_remedy() {
        // Each binding words its own remedy (Remedy); the core's texts name none. The
        // words are spliced so this test's own lines do not hold them.
        let host_words: Vec<String> = [
            ["ra", "ke "],
            ["migrate", "!"],
            ["idempotent_job", ".migrate"],
            ["IdempotentJob", "."],
            ["the ", "gem"],
            ["latest ", "gem"],
        ]
        .iter()
        .map(|p| p.concat())
        .collect();
        let mut files = Vec::new();
        sources(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        assert!(files.len() > 10, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for word in &host_words {
                    assert!(
                        !line.contains(word.as_str()),
                        "{}:{}: {word:?} in {line:?}",
                        file.display(),
                        n + 1
                    );
                }
            }
        }
    }

    #[test]
    fn remedies_are_named_not_worded() {
        let err = Error::from_server("42P01", "relation missing".into());
        assert_eq!(err.remedies(), &[Remedy::Migrate]);
        assert!(!err.to_string().contains("rake"), "{err}");
        assert!(err.worded(|_| "do it").ends_with("(do it)"));
    }
}
