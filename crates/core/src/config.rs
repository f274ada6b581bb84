//! Connection and pool settings, validated before anything connects.
//!
//! The Ruby layer hands the settings over as JSON (`Config::from_json`); unknown keys
//! and bad values are rejected with a message that names the key. Durations are in
//! seconds (floats allowed). The password is never part of any message.

use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use std::path::PathBuf;

use super::tls::{SslMode, TlsSettings};

use super::error::{Error, Result};

mod url;
pub use url::{describe_url, UrlParam};
use url::{known_url_params, split_params, split_tls_params};

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
    /// when no URL is given.
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub dbname: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    /// TLS (see [`super::tls`]); each overrides the URL's query parameter of that name.
    #[serde(default)]
    pub sslmode: Option<String>,
    #[serde(default)]
    pub sslrootcert: Option<String>,
    #[serde(default)]
    pub sslcert: Option<String>,
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
    /// [`MAX_RESULT_BYTES_LIMIT`].
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// Client-side bound, in seconds, on the enqueue check (`on_enqueue:
    /// :skip_completed`, one read at the push): past it the push goes ahead (the claim
    /// decides the delivery), so a producer never waits on an unreachable database for
    /// longer. Default [`DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS`].
    #[serde(default = "default_enqueue_check_timeout")]
    pub enqueue_check_timeout: f64,
    /// Which kind of server the gem talks to: `"postgresql"` (default) or
    /// `"distributed"` ([`COMPATIBILITY_DISTRIBUTED`]: CockroachDB, YugabyteDB, Aurora
    /// DSQL, or PostgreSQL behind a transaction-mode pooler such as RDS Proxy; see
    /// docs/scaling.md). The distributed profile keeps no session state: no named
    /// prepared statements (as `prepared_statements: false`), waits poll instead of
    /// LISTEN/NOTIFY, and migrations are serialised by a lock row instead of an
    /// advisory lock. Conflicts (40001, 40P01) are retried under both profiles.
    #[serde(default = "default_compatibility")]
    pub compatibility: String,
}

/// Default of `enqueue_check_timeout` ([`Config::enqueue_check_timeout`]), seconds.
pub const DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS: f64 = 0.5;

/// The `compatibility` values ([`Config::compatibility`]): plain PostgreSQL (default).
pub const COMPATIBILITY_POSTGRESQL: &str = "postgresql";
/// The `compatibility` values: a distributed or pooled PostgreSQL-compatible server.
pub const COMPATIBILITY_DISTRIBUTED: &str = "distributed";

/// PostgreSQL's limit for `statement_timeout` and `lock_timeout` (INT_MAX ms), in seconds.
pub const MAX_PG_TIMEOUT_SECONDS: f64 = 2_147_483.0;

/// Longest lease accepted, in seconds (ten years; PostgreSQL intervals overflow far
/// beyond that).
pub const MAX_LEASE_SECONDS: f64 = 315_360_000.0;

/// Longest `job_type` + `operation_key`, in bytes (the key rules, [`crate::keys`],
/// state it; named here with every other limit).
pub use crate::keys::MAX_KEY_BYTES;

/// Default of `max_result_bytes` ([`Config::max_result_bytes`]): 64 KiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 65_536;

/// How many repeats each record keeps the latest of (`repeat_times`, `repeat_facts`:
/// older ones are dropped, so a record stays bounded). The statements spell it with the
/// `repeats_kept!` text of the `sql` module, which this number is read from.
pub const REPEATS_KEPT: usize = digits(repeats_kept!());

/// The number a text of ASCII digits spells (a compile-time constant).
const fn digits(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "not a number");
        n = n * 10 + (bytes[i] - b'0') as usize;
        i += 1;
    }
    n
}

/// Largest `max_result_bytes` accepted: just under jsonb's limit (256 MiB).
pub const MAX_RESULT_BYTES_LIMIT: usize = 268_435_455;

/// Default `retention` setting, in seconds (30 days): how long a finished record
/// (completed or given up) is kept before a purge deletes it.
pub const DEFAULT_RETENTION_SECONDS: f64 = 2_592_000.0;

/// The connection settings' defaults by name, as JSON (`null`: none; a whole number
/// of seconds as an integer): the rows every binding reads instead of restating a
/// default (Ruby's `Configuration::NATIVE_DEFAULTS`, Python's `configure`, which
/// leaves unset ones to [`Config::new`]). Keys in [`CONNECTION_SETTINGS`] order.
pub fn connection_defaults_json() -> serde_json::Value {
    let c = Config::new("");
    let seconds = |s: f64| {
        if s.fract() == 0.0 {
            serde_json::json!(s as i64)
        } else {
            serde_json::json!(s)
        }
    };
    let mut rows = serde_json::Map::new();
    for name in CONNECTION_SETTINGS {
        let value = match *name {
            "pool_size" => serde_json::json!(c.pool_size),
            "connect_timeout" => seconds(c.connect_timeout),
            "checkout_timeout" => seconds(c.checkout_timeout),
            "application_name" => serde_json::json!(c.application_name),
            "prepared_statements" => serde_json::json!(c.prepared_statements),
            "deadline" => seconds(c.deadline),
            "asynchronous_completion" => serde_json::json!(c.asynchronous_completion),
            "max_result_bytes" => serde_json::json!(c.max_result_bytes),
            "compatibility" => serde_json::json!(c.compatibility),
            "enqueue_check_timeout" => seconds(c.enqueue_check_timeout),
            _ => serde_json::Value::Null, // none: the URL's, or off
        };
        rows.insert((*name).to_string(), value);
    }
    serde_json::Value::Object(rows)
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

fn positive_seconds(key: &str, value: f64) -> Result<Duration> {
    if !value.is_finite() || value <= 0.0 {
        return Err(Error::Config(format!(
            "{key} must be a positive number of seconds, got {value}"
        )));
    }
    Ok(Duration::from_secs_f64(value))
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

    /// The TLS settings: the URL's `sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
    /// overridden by the fields of the same names. Default `prefer`.
    ///
    /// Errors: [`Error::Config`] for an unknown sslmode.
    pub fn tls(&self) -> Result<TlsSettings> {
        let (_, from_url) = split_tls_params(&self.database_url);
        let param = |name: &str, field: &Option<String>| {
            field.clone().or_else(|| {
                from_url
                    .iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            })
        };
        let mode = match param("sslmode", &self.sslmode) {
            Some(mode) => SslMode::parse(&mode)?,
            // A key/value string's own sslmode, as tokio-postgres parsed it.
            None => tokio_postgres::Config::from_str(&self.database_url)
                .ok()
                .filter(|_| !self.database_url.trim().is_empty())
                .map_or(SslMode::default(), |pg| match pg.get_ssl_mode() {
                    tokio_postgres::config::SslMode::Disable => SslMode::Disable,
                    tokio_postgres::config::SslMode::Require => SslMode::Require,
                    _ => SslMode::Prefer,
                }),
        };
        Ok(TlsSettings {
            mode,
            rootcert: param("sslrootcert", &self.sslrootcert).map(PathBuf::from),
            cert: param("sslcert", &self.sslcert).map(PathBuf::from),
            key: param("sslkey", &self.sslkey).map(PathBuf::from),
        })
    }

    /// Parses and validates settings from a JSON object such as
    /// `{"database_url": "postgres://…", "pool_size": 5}`.
    ///
    /// Errors: [`Error::Config`] naming the unknown key or the bad value.
    pub fn from_json(json: &str) -> Result<Self> {
        let mut reader = serde_json::Deserializer::from_str(json);
        let mut config: Config = serde_path_to_error::deserialize(&mut reader)
            .map_err(|e| setting_error(e.path().to_string(), e.into_inner()))?;
        let pool_size_given = serde_json::from_str::<serde_json::Value>(json)
            .ok()
            .is_some_and(|v| v.get("pool_size").is_some_and(|p| !p.is_null()));
        config.validate()?;
        config.apply_url_params(pool_size_given)?;
        Ok(config)
    }

    /// What the URL's own parameters say about the gem's settings: Rails' `pool` (the
    /// pool size, `None` when absent) and `prepared_statements` (`None` when absent).
    ///
    /// Errors: [`Error::Config`] naming a parameter nobody knows (with the nearest
    /// known name), or a `pool` / `prepared_statements` value that is not a positive
    /// integer / a boolean.
    pub fn url_settings(&self) -> Result<(Option<usize>, Option<bool>)> {
        let (_, taken) = split_params(&self.database_url);
        let mut pool = None;
        let mut prepared = None;
        for (name, value) in taken {
            match UrlParam::of(&name) {
                UrlParam::Pool => {
                    pool = Some(value.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(
                        || {
                            Error::Config(format!(
                                "database_url parameter pool must be a positive integer, got {value:?}"
                            ))
                        },
                    )?)
                }
                UrlParam::PreparedStatements => {
                    prepared = Some(match value.as_str() {
                        "true" | "t" | "1" => true,
                        "false" | "f" | "0" => false,
                        _ => {
                            return Err(Error::Config(format!(
                                "database_url parameter prepared_statements must be true or false, \
                                 got {value:?}"
                            )))
                        }
                    })
                }
                UrlParam::Unknown => {
                    let hint = known_url_params()
                        .map(|k| (k, strsim::jaro_winkler(&name, k)))
                        .filter(|(_, score)| *score >= 0.8)
                        .max_by(|a, b| a.1.total_cmp(&b.1))
                        .map(|(k, _)| format!(" (did you mean {k}?)"))
                        .unwrap_or_default();
                    return Err(Error::Config(format!(
                        "database_url has a parameter neither PostgreSQL (libpq) nor Rails knows: \
                         {name}{hint}; remove it"
                    )));
                }
                _ => {}
            }
        }
        Ok((pool, prepared))
    }

    /// The URL's parameters that Rails or libpq know but that mean nothing to the
    /// gem's connections (`encoding`, `reconnect`, `variables[…]`…), each once, in
    /// order: the binding logs them in one line.
    pub fn ignored_url_params(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for (name, _) in split_params(&self.database_url).1 {
            if UrlParam::of(&name) == UrlParam::Ignored && !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// Applies the URL's `pool` (unless `pool_size` was given) and
    /// `prepared_statements=false` (named statements off, whatever the setting).
    fn apply_url_params(&mut self, pool_size_given: bool) -> Result<()> {
        let (pool, prepared) = self.url_settings()?;
        if let (Some(pool), false) = (pool, pool_size_given) {
            self.pool_size = pool;
        }
        if prepared == Some(false) {
            self.prepared_statements = false;
        }
        Ok(())
    }

    /// Whether the distributed profile is on ([`Config::compatibility`]).
    pub fn distributed(&self) -> bool {
        self.compatibility == COMPATIBILITY_DISTRIBUTED
    }

    /// Whether the pool's own statements are named prepared statements: the
    /// `prepared_statements` setting, off under the distributed profile.
    pub fn named_statements(&self) -> bool {
        self.prepared_statements && !self.distributed()
    }

    /// Checks every value; see [`Config::pg_config`] for the URL.
    pub fn validate(&self) -> Result<()> {
        if ![COMPATIBILITY_POSTGRESQL, COMPATIBILITY_DISTRIBUTED]
            .contains(&self.compatibility.as_str())
        {
            return Err(Error::Config(format!(
                "compatibility must be {COMPATIBILITY_POSTGRESQL:?} or \
                 {COMPATIBILITY_DISTRIBUTED:?}, got {:?}",
                self.compatibility
            )));
        }
        if self.pool_size == 0 {
            return Err(Error::Config("pool_size must be at least 1".into()));
        }
        positive_seconds("connect_timeout", self.connect_timeout)?;
        positive_seconds("checkout_timeout", self.checkout_timeout)?;
        positive_seconds("deadline", self.deadline)?;
        positive_seconds("enqueue_check_timeout", self.enqueue_check_timeout)?;
        if !(1..=MAX_RESULT_BYTES_LIMIT).contains(&self.max_result_bytes) {
            return Err(Error::Config(format!(
                "max_result_bytes must be from 1 to {} bytes (jsonb's limit), got {}",
                MAX_RESULT_BYTES_LIMIT, self.max_result_bytes
            )));
        }
        if self.deadline > MAX_PG_TIMEOUT_SECONDS {
            return Err(Error::Config(format!(
                "deadline must be at most {MAX_PG_TIMEOUT_SECONDS} seconds, got {}",
                self.deadline
            )));
        }
        if let Some(seconds) = self.statement_timeout {
            positive_seconds("statement_timeout", seconds)?;
            if seconds > MAX_PG_TIMEOUT_SECONDS {
                return Err(Error::Config(format!(
                    "statement_timeout must be at most {MAX_PG_TIMEOUT_SECONDS} seconds \
                     (PostgreSQL's limit), got {seconds}"
                )));
            }
        }
        if let Some(schema) = &self.schema {
            let valid = schema
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && schema
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
                && schema.len() <= 63;
            if !valid {
                return Err(Error::Config(format!(
                    "schema must be a plain PostgreSQL identifier (letters, digits, _), got {schema:?}"
                )));
            }
        }
        self.url_settings()?;
        self.pg_config().map(|_| ())
    }

    /// Seconds to establish a connection, as a `Duration`.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout)
    }

    /// The bound on the enqueue check ([`Config::enqueue_check_timeout`]).
    pub fn enqueue_check_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.enqueue_check_timeout)
    }

    /// The client-side bound on one call ([`Config::deadline`]), as a `Duration`.
    pub fn deadline(&self) -> Duration {
        Duration::from_secs_f64(self.deadline)
    }

    /// Seconds to wait for a pooled connection, as a `Duration`.
    pub fn checkout_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.checkout_timeout)
    }

    /// The tokio-postgres configuration: the URL parsed by tokio-postgres itself,
    /// plus `connect_timeout` and `application_name` (the URL's own values win).
    ///
    /// Errors: [`Error::Config`] when the URL is empty or cannot be parsed.
    pub fn pg_config(&self) -> Result<tokio_postgres::Config> {
        let mut pg = if self.database_url.trim().is_empty() {
            if self.host.is_none() {
                return Err(Error::Config(
                    "database_url is not set: set the database_url setting (or host, port, \
                     dbname, user, password), or IDEMPOTENT_JOB_DATABASE_URL / DATABASE_URL"
                        .into(),
                ));
            }
            tokio_postgres::Config::new()
        } else {
            // tokio-postgres's parse errors name the option, never its value.
            let (url, _) = split_tls_params(&self.database_url);
            if let Some((scheme, _)) = url.split_once("://") {
                let is_scheme = scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
                if is_scheme && scheme != "postgres" && scheme != "postgresql" {
                    let scheme: String = scheme.chars().take(40).collect();
                    return Err(Error::Config(format!(
                        "database_url has the scheme {scheme:?}: it must start with postgres:// \
                         or postgresql://"
                    )));
                }
            }
            tokio_postgres::Config::from_str(&url).map_err(|e| {
                // "invalid connection string" alone names nothing: add its cause
                // ("unknown option `x`", "invalid value for option `port`").
                let e = match std::error::Error::source(&e) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                };
                let hint = if e.contains("ssl") {
                    " (in a key/value string, set sslmode, sslrootcert, sslcert and sslkey as \
                     settings instead)"
                } else {
                    ""
                };
                Error::Config(format!("database_url could not be parsed: {e}{hint}"))
            })?
        };
        if let Some(host) = &self.host {
            pg.host(host);
        }
        if let Some(port) = self.port {
            pg.port(port);
        }
        if let Some(dbname) = &self.dbname {
            pg.dbname(dbname);
        }
        if let Some(user) = &self.user {
            pg.user(user);
        }
        if let Some(password) = &self.password {
            pg.password(password);
        }
        pg.ssl_mode(self.tls()?.mode.negotiation());
        if pg.get_hosts().is_empty() {
            return Err(Error::Config(format!(
                "database_url {} names no host",
                describe_url(&self.database_url)
            )));
        }
        if pg.get_user().is_none() {
            pg.user(std::env::var("USER").unwrap_or_else(|_| "postgres".into()));
        }
        let mut options = pg.get_options().unwrap_or_default().to_string();
        if let Some(seconds) = self.statement_timeout {
            options.push_str(&format!(
                " -c statement_timeout={}",
                (seconds * 1000.0).ceil() as u64
            ));
        }
        if let Some(schema) = &self.schema {
            options.push_str(&format!(" -c search_path={schema}"));
        }
        if !options.trim().is_empty() {
            pg.options(options.trim());
        }
        // Notice a dead peer host in about a minute rather than the kernel's two hours:
        // a transactional claim's row stays locked until PostgreSQL sees it gone.
        if pg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
            pg.keepalives_idle(Duration::from_secs(30));
        }
        // A partition that drops packets silently: the kernel gives a connection with
        // unacknowledged data up after the deadline instead of ~15 minutes of
        // retransmissions (the URL's own tcp_user_timeout wins).
        if pg.get_tcp_user_timeout().is_none() {
            pg.tcp_user_timeout(self.deadline());
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(positive_seconds("connect_timeout", self.connect_timeout)?);
        }
        if pg.get_application_name().is_none() {
            pg.application_name(&self.application_name);
        }
        Ok(pg)
    }
}

#[cfg(test)]
mod tests;
