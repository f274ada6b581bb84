//! Each connection setting's rule, stated once: what value it takes, whether it may be
//! unset, whether its value may appear in a message. [`Config::validate`](super::Config::validate)
//! checks a whole configuration by these rules, [`Config::from_json`](super::Config::from_json)
//! each setting it is given, and a binding that keeps the settings itself (the Ruby
//! gem's `Configuration`, at assignment) one setting with [`check_setting`]: one
//! wording in every language, the job options' ([`options::check_kind`]).

use serde_json::Value;

use super::limits::{
    COMPATIBILITY_DISTRIBUTED, COMPATIBILITY_POSTGRESQL, MAX_POOL_SIZE, MAX_RESULT_BYTES_LIMIT,
};
use crate::error::{Error, Result};
use crate::options::{self, Kind, DURATION, PG_TIMEOUT};

/// What values a connection setting takes.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// A job option's kind of value, worded as the options' ([`options::check_kind`]).
    Is(Kind),
    /// Any string (empty too: the URL's or libpq's default then).
    Text,
    /// A plain PostgreSQL identifier (the `schema`): letters, digits, `_`, at most 63
    /// bytes.
    Identifier,
}

/// One connection setting's rule.
#[derive(Debug, Clone, Copy)]
pub struct SettingRule {
    /// The setting's name ([`CONNECTION_SETTINGS`](super::CONNECTION_SETTINGS)).
    pub name: &'static str,
    /// What values it takes.
    pub rule: Rule,
    /// Whether it may be unset (`null`, Ruby's `nil`, Python's `None`): the core's
    /// default or the URL's value applies.
    pub unset_ok: bool,
    /// Whether a refused value is hidden from the message (`[REDACTED]`): the password
    /// and the URL, which may carry one.
    pub secret: bool,
}

const fn rule(name: &'static str, rule: Rule, unset_ok: bool) -> SettingRule {
    SettingRule {
        name,
        rule,
        unset_ok,
        secret: false,
    }
}

/// The compatibility profiles ([`Config::compatibility`](super::Config::compatibility)).
const COMPATIBILITIES: &[&str] = &[COMPATIBILITY_POSTGRESQL, COMPATIBILITY_DISTRIBUTED];

/// Every connection setting's rule, in [`CONNECTION_SETTINGS`](super::CONNECTION_SETTINGS) order.
pub const SETTING_RULES: &[SettingRule] = &[
    SettingRule {
        secret: true,
        ..rule("database_url", Rule::Text, true)
    },
    rule(
        "pool_size",
        Rule::Is(Kind::Count {
            min: 1,
            max: MAX_POOL_SIZE as i64,
            why_max: "PostgreSQL's most connections",
        }),
        true,
    ),
    rule("connect_timeout", Rule::Is(DURATION), false),
    rule("checkout_timeout", Rule::Is(DURATION), false),
    rule("application_name", Rule::Is(Kind::Text), false),
    rule("statement_timeout", Rule::Is(PG_TIMEOUT), true),
    rule("schema", Rule::Identifier, true),
    rule("host", Rule::Text, true),
    rule(
        "port",
        Rule::Is(Kind::Count {
            min: 1,
            max: 65_535,
            why_max: "a TCP port",
        }),
        true,
    ),
    rule("dbname", Rule::Text, true),
    rule("user", Rule::Text, true),
    SettingRule {
        secret: true,
        ..rule("password", Rule::Text, true)
    },
    rule("sslmode", Rule::Text, true),
    rule("sslrootcert", Rule::Text, true),
    rule("sslcert", Rule::Text, true),
    rule("sslkey", Rule::Text, true),
    rule("prepared_statements", Rule::Is(Kind::Boolean), false),
    rule("deadline", Rule::Is(PG_TIMEOUT), false),
    rule("asynchronous_completion", Rule::Is(Kind::Boolean), false),
    rule(
        "max_result_bytes",
        Rule::Is(Kind::Count {
            min: 1,
            max: MAX_RESULT_BYTES_LIMIT as i64,
            why_max: "jsonb's limit",
        }),
        true,
    ),
    rule("enqueue_check_timeout", Rule::Is(DURATION), false),
    rule(
        "compatibility",
        Rule::Is(Kind::Choice {
            allowed: COMPATIBILITIES,
        }),
        false,
    ),
];

/// What a connection setting's text must be when it holds U+0000 (every text a
/// connection sends is a C string: PostgreSQL's startup and password messages).
pub(super) const NUL_FREE: &str = "a string without a NUL character (U+0000), which a \
     PostgreSQL connection cannot send";

/// The rule of the connection setting `name`, if it is one.
pub fn setting_rule(name: &str) -> Option<&'static SettingRule> {
    SETTING_RULES.iter().find(|r| r.name == name)
}

/// `value` checked for the connection setting `name` by its rule ([`SETTING_RULES`]) and
/// returned as given (`null` for an unset one that may be unset). `shown` is how the
/// message shows a refused value (the host's notation, Ruby's `inspect`; `None`: its
/// JSON); a secret setting's value is never shown.
///
/// Errors: [`Error::Config`] "`name` must be …, got …" (the job options' wording), or
/// naming a setting that is no connection setting.
pub fn check_setting(name: &str, value: &Value, shown: Option<&str>) -> Result<Value> {
    let setting = setting_rule(name)
        .ok_or_else(|| Error::Config(format!("{name} is not a connection setting")))?;
    if value.is_null() && setting.unset_ok {
        return Ok(Value::Null);
    }
    let shown = if setting.secret {
        Some("[REDACTED]")
    } else {
        shown
    };
    let bad = |expected: &str| {
        let shown = shown.map_or_else(|| value.to_string(), str::to_string);
        Error::Config(format!("{name} must be {expected}, got {shown}"))
    };
    // Every text a connection sends (startup parameters, password, host) is a C string
    // on the wire: a NUL would fail every connect, retryably, naming nothing.
    if value.as_str().is_some_and(|text| text.contains('\0')) {
        return Err(bad(NUL_FREE));
    }
    match setting.rule {
        Rule::Is(kind) => options::check_kind(name, kind, value, shown),
        Rule::Text => match value {
            Value::String(_) => Ok(value.clone()),
            _ => Err(bad("a string")),
        },
        Rule::Identifier => match value.as_str() {
            Some(text) if plain_identifier(text) => Ok(value.clone()),
            _ => Err(bad(
                "a plain PostgreSQL identifier (letters, digits, _; at most 63 bytes)",
            )),
        },
    }
}

/// The refusal of an unset value (`null`, Ruby's `nil`, Python's `None`) for a setting
/// that must have one and has a default the core states: [`Error::Config`] "`name` must
/// be set (its default is `default`), got `shown`" (`default` as JSON; `shown` in the
/// host's notation, else `null`). The job default settings of the options' table
/// (`lease`, `on_stale`, …: the job settings' `JobDefaults::check`) refuse an unset
/// value with it in both bindings.
pub fn must_be_set(name: &str, default: &Value, shown: Option<&str>) -> Error {
    let shown = shown.unwrap_or("null");
    Error::Config(format!(
        "{name} must be set (its default is {default}), got {shown}"
    ))
}

/// Whether `text` is a plain PostgreSQL identifier: a letter or `_`, then letters,
/// digits, `_` or `$`, at most 63 bytes (NAMEDATALEN - 1).
fn plain_identifier(text: &str) -> bool {
    text.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        && text.len() <= 63
}
