//! The settings themselves: [`Config`] (read from JSON, each named setting's default),
//! the list of their names and their defaults as rows for the bindings, and the words
//! of a setting serde could not read.

use serde::Deserialize;

use super::limits::{
    COMPATIBILITY_POSTGRESQL, DATABASE_URL_VARIABLES, DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS,
    DEFAULT_MAX_RESULT_BYTES, MAX_POOL_SIZE, POOL_HEADROOM,
};
use super::rules::{check_setting, setting_rule};
use super::url::describe_url;
use crate::error::{Error, Result};

/// Validated settings for one store (one database: its pool and what the process
/// keeps beside it).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// libpq-style URL or key/value string, parsed by tokio-postgres. May be empty
    /// when the discrete fields name a host.
    #[serde(default)]
    pub database_url: String,
    /// Maximum pooled connections per process. Default 10.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// Seconds to wait for a TCP/Unix connection and startup. Default 5.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: f64,
    /// Seconds to wait for a free pooled connection. Default 5.
    #[serde(default = "default_checkout_timeout")]
    pub checkout_timeout: f64,
    /// `application_name` reported to PostgreSQL unless the URL sets one.
    #[serde(default = "default_application_name")]
    pub application_name: String,
    /// Seconds a statement may run before PostgreSQL cancels it (`statement_timeout`);
    /// none by default.
    #[serde(default)]
    pub statement_timeout: Option<f64>,
    /// Schema of the record table: the connection's `search_path`. None: the default.
    #[serde(default)]
    pub schema: Option<String>,
    /// Discrete connection fields; each overrides the URL's, and they alone are enough
    /// when no URL is given. This one: the server's host name or address (or a Unix
    /// socket directory).
    #[serde(default)]
    pub host: Option<String>,
    /// The server's port (see `host`).
    #[serde(default)]
    pub port: Option<u16>,
    /// The database's name (see `host`).
    #[serde(default)]
    pub dbname: Option<String>,
    /// The role to connect as (see `host`).
    #[serde(default)]
    pub user: Option<String>,
    /// The role's password (see `host`); never shown in an error.
    #[serde(default)]
    pub password: Option<String>,
    /// TLS (see [`crate::tls`]); each overrides the URL's query parameter of that name.
    /// This one: `disable`, `prefer`, `require`, `verify-ca` or `verify-full`.
    #[serde(default)]
    pub sslmode: Option<String>,
    /// Path of the PEM roots `verify-ca`/`verify-full` trust (see `sslmode`).
    #[serde(default)]
    pub sslrootcert: Option<String>,
    /// Path of the PEM client certificate chain (see `sslmode`).
    #[serde(default)]
    pub sslcert: Option<String>,
    /// Path of the PEM private key of `sslcert` (see `sslmode`).
    #[serde(default)]
    pub sslkey: Option<String>,
    /// Send the gem's own statements (the claim, the fenced changes, the record read)
    /// as named prepared statements, prepared once per pooled connection and then only
    /// bound and executed, instead of unnamed statements PostgreSQL parses and plans
    /// at every call. Still one round trip per decision once prepared. Default true;
    /// set false behind PgBouncer in transaction mode before 1.21 (or without
    /// `max_prepared_statements`), which cannot keep named statements.
    #[serde(default = "default_prepared_statements")]
    pub prepared_statements: bool,
    /// Client-side bound, in seconds, on one call of the gem: checking out (and
    /// connecting) plus its statement, retries on fresh connections included. Past it
    /// the connection is discarded and a retryable [`crate::error::Error::Timeout`]
    /// raised, even when the network drops packets silently (PostgreSQL's
    /// `statement_timeout` cannot help then). Also the connections' `TCP_USER_TIMEOUT`.
    /// Default 10.
    #[serde(default = "default_deadline")]
    pub deadline: f64,
    /// Commit the completion outside a transaction with `synchronous_commit = off`
    /// (`COMPLETE_ASYNCHRONOUSLY_SQL`): no wait for the WAL flush.
    /// Risk: a PostgreSQL crash within `wal_writer_delay` of a completion can lose it;
    /// the record stays claimed and the stale policy decides once the lease ends.
    /// Default false.
    #[serde(default)]
    pub asynchronous_completion: bool,
    /// Largest result, in bytes of JSON text, a completion stores for a replay
    /// (`store_result`); a larger one is not stored and the completion stands (see
    /// `record::prepare`). Default [`DEFAULT_MAX_RESULT_BYTES`] (64 KiB), at most
    /// [`MAX_RESULT_BYTES_LIMIT`](super::MAX_RESULT_BYTES_LIMIT).
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// Client-side bound, in seconds, on the enqueue check (`on_enqueue:
    /// :skip_completed`, one read at the push): past it the push goes ahead (the claim
    /// decides the delivery), so a producer never waits on an unreachable database for
    /// longer. Default [`DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS`].
    #[serde(default = "default_enqueue_check_timeout")]
    pub enqueue_check_timeout: f64,
    /// Which kind of server the gem talks to: `"postgresql"` (default) or
    /// `"distributed"` ([`COMPATIBILITY_DISTRIBUTED`](super::COMPATIBILITY_DISTRIBUTED): CockroachDB, YugabyteDB, Aurora
    /// DSQL, or PostgreSQL behind a transaction-mode pooler such as RDS Proxy; see
    /// docs/scaling.md). The distributed profile keeps no session state: no named
    /// prepared statements (as `prepared_statements: false`), waits poll instead of
    /// LISTEN/NOTIFY, and migrations are serialised by a lock row instead of an
    /// advisory lock. Conflicts (40001, 40P01) are retried under both profiles.
    #[serde(default = "default_compatibility")]
    pub compatibility: String,
}

/// The connection settings' defaults by name, as JSON (`null`: none; a whole number
/// of seconds as an integer): the rows every binding reads instead of restating a
/// default (Ruby's `Configuration::NATIVE_DEFAULTS`, Python's `configure`, which
/// leaves unset ones to [`Config::new`]). An object, whose keys serde_json keeps
/// sorted: [`CONNECTION_SETTINGS`] gives their order. The URL's is the empty string.
pub fn connection_defaults_json() -> serde_json::Value {
    let c = Config::new("");
    let rows: serde_json::Map<String, serde_json::Value> = CONNECTION_SETTINGS
        .iter()
        .map(|name| ((*name).to_string(), c.value_of(name)))
        .collect();
    serde_json::Value::Object(rows)
}

/// The pool size when the `pool_size` setting is unset: the queue's `concurrency` (its
/// worker threads in this process, when the binding knows it) plus [`POOL_HEADROOM`]
/// (at most [`MAX_POOL_SIZE`]), else the default (10).
pub fn pool_size_for(concurrency: Option<usize>) -> usize {
    concurrency.map_or_else(default_pool_size, |threads| {
        threads.saturating_add(POOL_HEADROOM).min(MAX_POOL_SIZE)
    })
}

/// The database URL of the environment: the first of [`DATABASE_URL_VARIABLES`] that is
/// set and not empty, read at each call (`None` when none is).
pub fn env_database_url() -> Option<String> {
    DATABASE_URL_VARIABLES
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// The names of [`Config`]'s settings (the connection and pool), in its field order, for
/// a binding that sorts a host's `configure` keywords between them and the job defaults
/// and names the known settings in an error.
pub const CONNECTION_SETTINGS: &[&str] = &[
    "database_url",
    "pool_size",
    "connect_timeout",
    "checkout_timeout",
    "application_name",
    "statement_timeout",
    "schema",
    "host",
    "port",
    "dbname",
    "user",
    "password",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "prepared_statements",
    "deadline",
    "asynchronous_completion",
    "max_result_bytes",
    "enqueue_check_timeout",
    "compatibility",
];

/// The error for a setting serde could not read: names the setting (`path`, as
/// serde_path_to_error gives it; "." for the whole object) and what its value must be,
/// in words rather than Rust's type names ("expected usize" → "a whole number").
/// serde_json's messages echo numbers and short strings, never a whole URL.
fn setting_error(path: String, error: serde_json::Error) -> Error {
    let text = error.to_string();
    let text = text.split(" at line ").next().unwrap_or(&text).to_string();
    let words = [
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected u32", "expected a whole number, 0 or more"),
        ("expected i64", "expected a whole number"),
        (
            "expected f64",
            "expected a number (seconds where it is a time)",
        ),
        ("expected a boolean", "expected true or false"),
    ];
    let text = words
        .iter()
        .fold(text, |text, (rust, plain)| text.replace(rust, plain));
    if path == "." || path.is_empty() {
        Error::Config(format!("invalid idempotent_job configuration: {text}"))
    } else {
        Error::Config(format!("idempotent_job setting {path}: {text}"))
    }
}

fn default_pool_size() -> usize {
    10
}
fn default_connect_timeout() -> f64 {
    5.0
}
fn default_checkout_timeout() -> f64 {
    5.0
}
fn default_application_name() -> String {
    "idempotent_job".to_string()
}
fn default_prepared_statements() -> bool {
    true
}
fn default_compatibility() -> String {
    COMPATIBILITY_POSTGRESQL.into()
}
fn default_max_result_bytes() -> usize {
    DEFAULT_MAX_RESULT_BYTES
}
fn default_enqueue_check_timeout() -> f64 {
    DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS
}
fn default_deadline() -> f64 {
    10.0
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("database_url", &describe_url(&self.database_url))
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("checkout_timeout", &self.checkout_timeout)
            .field("application_name", &self.application_name)
            .field("statement_timeout", &self.statement_timeout)
            .field("schema", &self.schema)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("dbname", &self.dbname)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "[REDACTED]"))
            .field("prepared_statements", &self.prepared_statements)
            .field("deadline", &self.deadline)
            .field("asynchronous_completion", &self.asynchronous_completion)
            .field("max_result_bytes", &self.max_result_bytes)
            .field("enqueue_check_timeout", &self.enqueue_check_timeout)
            .field("compatibility", &self.compatibility)
            .finish()
    }
}

impl Config {
    /// Settings for `database_url` with every other field at its default (or the
    /// URL's `pool` and `prepared_statements=false`; a bad one is reported by
    /// [`Config::validate`]).
    pub fn new(database_url: impl Into<String>) -> Self {
        let mut config = Config {
            database_url: database_url.into(),
            pool_size: default_pool_size(),
            connect_timeout: default_connect_timeout(),
            checkout_timeout: default_checkout_timeout(),
            application_name: default_application_name(),
            statement_timeout: None,
            schema: None,
            host: None,
            port: None,
            dbname: None,
            user: None,
            password: None,
            sslmode: None,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            prepared_statements: default_prepared_statements(),
            deadline: default_deadline(),
            asynchronous_completion: false,
            max_result_bytes: default_max_result_bytes(),
            enqueue_check_timeout: default_enqueue_check_timeout(),
            compatibility: default_compatibility(),
        };
        // A bad parameter is reported by validate(), which every store runs.
        let _ = config.apply_url_params(false);
        config
    }

    /// The setting `name`'s value as JSON (`null`: unset; a whole number of seconds as
    /// an integer), for a message or a binding: what [`check_setting`] judges.
    pub fn value_of(&self, name: &str) -> serde_json::Value {
        use serde_json::json;
        let seconds = |s: f64| {
            if s.fract() == 0.0 && s.abs() < 9.0e15 {
                json!(s as i64)
            } else {
                json!(s)
            }
        };
        match name {
            "database_url" => json!(self.database_url),
            "pool_size" => json!(self.pool_size),
            "connect_timeout" => seconds(self.connect_timeout),
            "checkout_timeout" => seconds(self.checkout_timeout),
            "application_name" => json!(self.application_name),
            "statement_timeout" => self.statement_timeout.map_or(json!(null), seconds),
            "schema" => json!(self.schema),
            "host" => json!(self.host),
            "port" => json!(self.port),
            "dbname" => json!(self.dbname),
            "user" => json!(self.user),
            "password" => json!(self.password),
            "sslmode" => json!(self.sslmode),
            "sslrootcert" => json!(self.sslrootcert),
            "sslcert" => json!(self.sslcert),
            "sslkey" => json!(self.sslkey),
            "prepared_statements" => json!(self.prepared_statements),
            "deadline" => seconds(self.deadline),
            "asynchronous_completion" => json!(self.asynchronous_completion),
            "max_result_bytes" => json!(self.max_result_bytes),
            "enqueue_check_timeout" => seconds(self.enqueue_check_timeout),
            "compatibility" => json!(self.compatibility),
            _ => json!(null),
        }
    }

    /// Parses and validates settings from a JSON object such as
    /// `{"database_url": "postgres://…", "pool_size": 5}`: each known setting first by
    /// its rule ([`check_setting`]; an unset one that may be unset takes its default),
    /// then the whole ([`Config::validate`]).
    ///
    /// Errors: [`Error::Config`] naming the unknown key or the bad value.
    pub fn from_json(json: &str) -> Result<Self> {
        let mut given: serde_json::Value =
            serde_json::from_str(json).map_err(|e| setting_error(".".into(), e))?;
        if let Some(settings) = given.as_object_mut() {
            for (name, value) in settings.iter() {
                if setting_rule(name).is_some() {
                    check_setting(name, value, None)?;
                }
            }
            settings.retain(|name, value| !(value.is_null() && setting_rule(name).is_some()));
        }
        let pool_size_given = given.get("pool_size").is_some();
        let mut config: Config = serde_path_to_error::deserialize(given)
            .map_err(|e| setting_error(e.path().to_string(), e.into_inner()))?;
        config.validate()?;
        config.apply_url_params(pool_size_given)?;
        Ok(config)
    }
}
