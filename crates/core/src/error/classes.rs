//! The exception classes every binding defines, the SQLSTATEs each stands for, and
//! what a person does about an error: the table of [`ERROR_CLASSES`].

use super::Error;

/// One exception class as every binding defines it (Ruby's `IdempotentJob::<name>`,
/// Python's `idempotent_job.<name>`, the base being `IdempotentJobError` there): the
/// one table both languages' classes are checked against (`spec/idempotent_job/errors_spec.rb`,
/// `python/tests/test_errors.py`), read through [`error_table_json`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorClass {
    /// The class name in every binding (`"Error"`: the base).
    pub name: &'static str,
    /// The attributes the class carries beyond its message, `sqlstate` and `retryable`:
    /// every binding's class defines exactly these (no other class defines them), set
    /// by the core from [`Error::attributes`] or, for those of [`Self::host_attributes`],
    /// by the binding where it raises the error (nil/None where it does not know them).
    pub attributes: &'static [&'static str],
    /// The attributes of [`Self::attributes`] the binding fills in itself, the core's
    /// [`Error`] not carrying them: the operation key error's job type, job class and
    /// key declaration (a host value).
    pub host_attributes: &'static [&'static str],
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

/// Attributes of an operation key error, set by the binding that refuses the key: the
/// job type (the record's, when known), the job class and the key declaration as given.
const KEY_ATTRIBUTES: &[&str] = &["job_type", "job_class", "declaration"];

/// Every exception class, the base first; [`Error::class_name`] names one of them.
pub const ERROR_CLASSES: &[ErrorClass] = &[
    ErrorClass {
        name: "Error",
        attributes: &[],
        host_attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "the base of every error the library raises (also: a panic in native code)",
    },
    ErrorClass {
        name: "ConfigurationError",
        attributes: &[],
        host_attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "invalid configuration or option: a bad URL, an unknown name, a value out of range",
    },
    ErrorClass {
        name: "UnreadableRecordError",
        attributes: &[],
        host_attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "a ConfigurationError: a record holds a value the core cannot read (a time edited to 'infinity')",
    },
    ErrorClass {
        name: "ConnectionError",
        attributes: &[],
        host_attributes: &[],
        always_retryable: true,
        sqlstates: &["08*", "57P01", "57P02", "57P03", "53300"],
        sends_back: true,
        doc: "PostgreSQL could not be reached or the connection was lost; the body did not run",
    },
    ErrorClass {
        name: "DatabaseError",
        attributes: &[],
        host_attributes: &[],
        always_retryable: false,
        sqlstates: &["*"],
        sends_back: true,
        doc: "PostgreSQL answered with an error (retryable for a transient SQLSTATE)",
    },
    ErrorClass {
        name: "LostClaimError",
        attributes: RECORD_ATTRIBUTES,
        host_attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "a completion or release found its fencing token replaced: another delivery took over",
    },
    ErrorClass {
        name: "MigrationError",
        attributes: &[],
        host_attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: true,
        doc: "applying the migrations failed; the migration's transaction was rolled back",
    },
    ErrorClass {
        name: "OperationKeyError",
        attributes: KEY_ATTRIBUTES,
        host_attributes: KEY_ATTRIBUTES,
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "a malformed key declaration, or arguments that yield no operation key; the body did not run",
    },
    ErrorClass {
        name: "LockTimeoutError",
        attributes: &[],
        host_attributes: &[],
        always_retryable: true,
        sqlstates: &["55P03"],
        sends_back: true,
        doc: "a lock wait ran past its bound: another delivery's transaction is open",
    },
    ErrorClass {
        name: "TimeoutError",
        attributes: &[],
        host_attributes: &[],
        always_retryable: true,
        sqlstates: &["57014"],
        sends_back: true,
        doc: "a configured timeout ran out (connect, checkout, statement); nothing was decided",
    },
    ErrorClass {
        name: "PayloadMismatchError",
        attributes: RECORD_ATTRIBUTES,
        host_attributes: &[],
        always_retryable: false,
        sqlstates: &[],
        sends_back: false,
        doc: "a delivery's payload differs from its claim's and the job refuses mismatches",
    },
    ErrorClass {
        name: "LookupError",
        attributes: RECORD_ATTRIBUTES,
        host_attributes: &[],
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
pub(super) fn state_matches(code: &str, patterns: &[&str]) -> bool {
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
/// order, each `{"name", "attributes", "host_attributes", "always_retryable",
/// "sqlstates", "sends_back", "doc"}`, the
/// `DatabaseError` entry with `"retryable_sqlstates"` ([`TRANSIENT_STATES`]) too.
pub fn error_table_json() -> serde_json::Value {
    let classes = ERROR_CLASSES.iter().map(|c| {
        let mut entry = serde_json::json!({
            "name": c.name,
            "attributes": c.attributes,
            "host_attributes": c.host_attributes,
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
        "UnreadableRecordError" => Error::Unreadable(message),
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

/// Whether SQLSTATE `code` is of an answer that usually passes ([`TRANSIENT_STATES`]).
pub fn is_transient_state(code: &str) -> bool {
    state_matches(code, TRANSIENT_STATES)
}
