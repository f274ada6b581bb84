//! Connection and pool settings, validated before anything connects.
//!
//! The Ruby layer hands the settings over as JSON (`Config::from_json`); unknown keys
//! and bad values are rejected with a message that names the key. Durations are in
//! seconds (floats allowed). The password is never part of any message.
//!
//! By concern: `settings` (the [`Config`] struct, its defaults, reading it from JSON),
//! `limits` (the limits and defaults every binding reads), `rules` (each setting's
//! rule, checked one at a time or all by [`Config::validate`]), `validate` (the checks and
//! the durations), `connect` (TLS, the URL's parameters, the tokio-postgres
//! configuration), `url` (splitting and describing a URL).

mod connect;
mod limits;
mod rules;
mod settings;
mod url;
mod validate;

pub use limits::{
    COMPATIBILITY_DISTRIBUTED, COMPATIBILITY_POSTGRESQL, DATABASE_URL_VARIABLES,
    DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RETENTION_SECONDS,
    MAX_KEY_BYTES, MAX_LEASE_SECONDS, MAX_PG_TIMEOUT_SECONDS, MAX_POOL_SIZE,
    MAX_RESULT_BYTES_LIMIT, POOL_HEADROOM, REPEATS_KEPT,
};
pub use rules::{check_setting, must_be_set, setting_rule, Rule, SettingRule, SETTING_RULES};
pub use settings::{
    connection_defaults_json, env_database_url, pool_size_for, Config, CONNECTION_SETTINGS,
};
pub use url::{describe_url, UrlParam};

#[cfg(test)]
mod tests;
