//! Connection and pool settings, validated before anything connects.
//!
//! The Ruby layer hands the settings over as JSON (`Config::from_json`); unknown keys
//! and bad values are rejected with a message that names the key. Durations are in
//! seconds (floats allowed). The password is never part of any message.

use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use super::error::{Error, Result};

/// Validated settings for one [`crate::core::store::Store`].
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// libpq-style URL or key/value string, parsed by tokio-postgres.
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

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("database_url", &redact_url(&self.database_url))
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("checkout_timeout", &self.checkout_timeout)
            .field("application_name", &self.application_name)
            .finish()
    }
}

/// Replaces the password of a `postgres://user:password@host` URL with `[REDACTED]`.
/// Key/value strings (`password=…`) are redacted as well.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                let start = rest_start + colon + 1;
                out.replace_range(start..rest_start + at, "[REDACTED]");
            }
        }
    }
    redact_param(&out, "password=")
}

fn redact_param(text: &str, marker: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(marker) {
        out.push_str(&rest[..i + marker.len()]);
        out.push_str("[REDACTED]");
        rest = &rest[i + marker.len()..];
        let end = rest.find(['&', ' ']).unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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
    /// Settings for `database_url` with every other field at its default.
    pub fn new(database_url: impl Into<String>) -> Self {
        Config {
            database_url: database_url.into(),
            pool_size: default_pool_size(),
            connect_timeout: default_connect_timeout(),
            checkout_timeout: default_checkout_timeout(),
            application_name: default_application_name(),
        }
    }

    /// Parses and validates settings from a JSON object such as
    /// `{"database_url": "postgres://…", "pool_size": 5}`.
    ///
    /// Errors: [`Error::Config`] naming the unknown key or the bad value.
    pub fn from_json(json: &str) -> Result<Self> {
        let config: Config = serde_json::from_str(json).map_err(|e| {
            // serde_json's messages name the field ("unknown field `x`, expected …")
            // and never echo a string value back, so no password can leak here.
            Error::Config(format!("invalid idempotent_job configuration: {e}"))
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; see [`Config::pg_config`] for the URL.
    pub fn validate(&self) -> Result<()> {
        if self.pool_size == 0 {
            return Err(Error::Config("pool_size must be at least 1".into()));
        }
        positive_seconds("connect_timeout", self.connect_timeout)?;
        positive_seconds("checkout_timeout", self.checkout_timeout)?;
        self.pg_config().map(|_| ())
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
        if self.database_url.trim().is_empty() {
            return Err(Error::Config(
                "database_url is not set: configure IdempotentJob.database_url or set \
                 IDEMPOTENT_JOB_DATABASE_URL / DATABASE_URL"
                    .into(),
            ));
        }
        let mut pg = tokio_postgres::Config::from_str(&self.database_url).map_err(|e| {
            Error::Config(format!(
                "database_url {} could not be parsed: {}",
                redact_url(&self.database_url),
                redact_param(&e.to_string(), "password=")
            ))
        })?;
        if pg.get_hosts().is_empty() {
            return Err(Error::Config(format!(
                "database_url {} names no host",
                redact_url(&self.database_url)
            )));
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
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let err = Config::from_json(r#"{"database_url":"postgres://h/db","pool_sise":3}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool_sise"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = Config::from_json(r#"{"database_url":"postgres://h/db","checkout_timeout":0}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("checkout_timeout"), "{err}");
        let err = Config::from_json(r#"{"database_url":""}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("database_url is not set"), "{err}");
    }

    #[test]
    fn passwords_never_appear_in_messages_or_debug() {
        let c = Config::new("postgres://app:s3cret-pw@db.example/app?sslmode=bogus");
        let err = c.validate().unwrap_err().to_string();
        assert!(!err.contains("s3cret-pw"), "{err}");
        assert!(!format!("{c:?}").contains("s3cret-pw"));
        let kv = Config::new("host=h password=s3cret-pw port=notaport");
        assert!(!kv.validate().unwrap_err().to_string().contains("s3cret-pw"));
        assert!(!format!("{kv:?}").contains("s3cret-pw"));
    }

    #[test]
    fn redacts_url_userinfo_only() {
        assert_eq!(
            redact_url("postgres://u:p@h:5/db?x=1"),
            "postgres://u:[REDACTED]@h:5/db?x=1"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    }
}
