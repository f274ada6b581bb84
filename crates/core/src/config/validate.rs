//! Checking the settings ([`Config::validate`], run before anything connects) and
//! reading them as the pool uses them (durations, the distributed profile).

use std::time::Duration;

use super::limits::{
    COMPATIBILITY_DISTRIBUTED, COMPATIBILITY_POSTGRESQL, MAX_PG_TIMEOUT_SECONDS,
    MAX_RESULT_BYTES_LIMIT,
};
use super::Config;
use crate::error::{Error, Result};

/// `value` seconds as a `Duration`, when positive and finite.
///
/// Errors: [`Error::Config`] naming `key`.
pub(super) fn positive_seconds(key: &str, value: f64) -> Result<Duration> {
    if !value.is_finite() || value <= 0.0 {
        return Err(Error::Config(format!(
            "{key} must be a positive number of seconds, got {value}"
        )));
    }
    Ok(Duration::from_secs_f64(value))
}

impl Config {
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
}
