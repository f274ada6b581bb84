//! From the settings to a connection: the TLS settings, the URL's own parameters
//! (Rails' `pool` and `prepared_statements`, the ignored ones) and the tokio-postgres
//! configuration ([`Config::pg_config`]).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::limits::DATABASE_URL_VARIABLES;
use super::rules::check_setting;
use super::url::{
    describe_url, known_url_params, query_values, split_params, split_tls_params, UrlParam,
};
use super::Config;
use crate::error::{Error, Result};
use crate::options::{check_kind, DURATION};
use crate::tls::{SslMode, TlsSettings};

/// How messages name the URL's own `connect_timeout` (libpq's parameter, which the
/// driver parses).
const URL_CONNECT_TIMEOUT: &str = "database_url parameter connect_timeout";

/// The URL's own `connect_timeout` (`text`, as the URL gives it) checked by the rule of
/// the `connect_timeout` setting ([`DURATION`]: a positive number of seconds up to ten
/// years), in its words: past tokio's `Instant` range a timeout never fires. Zero or a
/// negative number is libpq's "no timeout", which the driver ignores (the setting's
/// timeout applies); text that is no number is left to the driver's parse, which
/// refuses it naming the parameter.
fn check_url_connect_timeout(text: &str) -> Result<()> {
    let Ok(seconds) = text.trim().parse::<f64>() else {
        return Ok(());
    };
    if seconds <= 0.0 {
        return Ok(());
    }
    let shown = serde_json::Value::String(text.to_string()).to_string();
    check_kind(
        URL_CONNECT_TIMEOUT,
        DURATION,
        &serde_json::json!(seconds),
        Some(&shown),
    )
    .map(|_| ())
}

impl Config {
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

    /// What the URL's own parameters say about the gem's settings: Rails' `pool` (the
    /// pool size, `None` when absent) and `prepared_statements` (`None` when absent).
    ///
    /// Errors: [`Error::Config`] naming a parameter nobody knows (with the nearest
    /// known name), a `pool` / `prepared_statements` value that is not a positive
    /// integer / a boolean, or a `connect_timeout` beyond the `connect_timeout`
    /// setting's rule (a positive number of seconds up to ten years).
    pub fn url_settings(&self) -> Result<(Option<usize>, Option<bool>)> {
        for timeout in query_values(&self.database_url, "connect_timeout") {
            check_url_connect_timeout(&timeout)?;
        }
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
                // A TLS parameter is the setting of the same name: checked by its rule (a
                // NUL refused before the pool opens a file), shown as the setting form
                // shows it (JSON: a NUL as \u0000), named as the URL's.
                UrlParam::Tls => {
                    check_setting(&name, &serde_json::Value::String(value), None).map_err(
                        |e| Error::Config(format!("database_url's {e}")),
                    )?;
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
    pub(super) fn apply_url_params(&mut self, pool_size_given: bool) -> Result<()> {
        let (pool, prepared) = self.url_settings()?;
        if let (Some(pool), false) = (pool, pool_size_given) {
            self.pool_size = pool;
        }
        if prepared == Some(false) {
            self.prepared_statements = false;
        }
        Ok(())
    }

    /// The tokio-postgres configuration: the URL parsed by tokio-postgres itself,
    /// plus `connect_timeout` and `application_name` (the URL's own values win).
    ///
    /// Errors: [`Error::Config`] when the URL is empty or cannot be parsed, or its own
    /// `connect_timeout` is beyond the `connect_timeout` setting's rule.
    pub fn pg_config(&self) -> Result<tokio_postgres::Config> {
        let mut pg = if self.database_url.trim().is_empty() {
            if self.host.is_none() {
                // Discrete fields without a host (a Rails database.yml relying on libpq's
                // Unix-socket default): name host as the missing one.
                let given: Vec<&str> = [
                    ("port", self.port.is_some()),
                    ("dbname", self.dbname.is_some()),
                    ("user", self.user.is_some()),
                    ("password", self.password.is_some()),
                ]
                .into_iter()
                .filter_map(|(name, set)| set.then_some(name))
                .collect();
                if !given.is_empty() {
                    return Err(Error::Config(format!(
                        "host is not set: {} (discrete connection fields) need host too: a host \
                         name or address, or the directory of PostgreSQL's Unix socket (such as \
                         /var/run/postgresql); or set database_url, {} instead",
                        given.join(", "),
                        DATABASE_URL_VARIABLES.join(" or ")
                    )));
                }
                return Err(Error::Config(format!(
                    "database_url is not set: set the database_url setting (or host, port, \
                     dbname, user, password), or {}",
                    DATABASE_URL_VARIABLES.join(" / ")
                )));
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
        match pg.get_connect_timeout() {
            // The URL's own (a key/value string's too), by the setting's rule.
            Some(timeout) => check_url_connect_timeout(&timeout.as_secs().to_string())?,
            None => {
                check_setting("connect_timeout", &self.value_of("connect_timeout"), None)?;
                pg.connect_timeout(self.connect_timeout());
            }
        }
        let url_application_name = pg.get_application_name().is_some();
        if !url_application_name {
            pg.application_name(&self.application_name);
        }
        // The startup and password messages are C strings: a NUL (a URL's %00) would fail
        // every connect as a retryable ConnectionError naming nothing; refused here,
        // naming where it came from, never the value.
        let texts = [
            (
                "user",
                self.user.is_none(),
                pg.get_user().map(str::as_bytes),
            ),
            (
                "dbname",
                self.dbname.is_none(),
                pg.get_dbname().map(str::as_bytes),
            ),
            ("password", self.password.is_none(), pg.get_password()),
            (
                "application_name",
                url_application_name,
                pg.get_application_name().map(str::as_bytes),
            ),
            ("options", true, pg.get_options().map(str::as_bytes)),
        ];
        for (name, from_url, text) in texts {
            if text.is_some_and(|t| t.contains(&0)) {
                let whose = if from_url { "database_url's " } else { "" };
                return Err(Error::Config(format!(
                    "{whose}{name} must be {}",
                    super::rules::NUL_FREE
                )));
            }
        }
        Ok(pg)
    }
}
