//! Connection and pool settings, validated before anything connects.
//!
//! The Ruby layer hands the settings over as JSON (`Config::from_json`); unknown keys
//! and bad values are rejected with a message that names the key. Durations are in
//! seconds (floats allowed). The password is never part of any message.
//!
//! By concern: `settings` (the [`Config`] struct, its defaults, reading it from JSON),
//! `limits` (the limits and defaults every binding reads), `validate` (the checks and
//! the durations), `connect` (TLS, the URL's parameters, the tokio-postgres
//! configuration), `url` (splitting and describing a URL).

mod connect;
mod limits;
mod settings;
mod url;
mod validate;

pub use limits::{
    COMPATIBILITY_DISTRIBUTED, COMPATIBILITY_POSTGRESQL, DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS,
    DEFAULT_MAX_RESULT_BYTES, DEFAULT_RETENTION_SECONDS, MAX_KEY_BYTES, MAX_LEASE_SECONDS,
    MAX_PG_TIMEOUT_SECONDS, MAX_RESULT_BYTES_LIMIT, REPEATS_KEPT,
};
pub use settings::{connection_defaults_json, Config, CONNECTION_SETTINGS};
pub use url::{describe_url, UrlParam};

#[cfg(test)]
mod tests;
