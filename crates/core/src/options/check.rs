//! The check of one option's value ([`check`]): normalised, or refused with a message
//! naming the job, the option and what it must be.

use serde_json::{json, Value};

use super::json::seconds_json;
use super::names::{owner, unknown};
use super::table::{find, Kind};
use crate::error::{Error, Result};

/// How the user's value is shown in a message: `shown` when the binding gives its own
/// spelling (Ruby's `inspect`), else the JSON text.
fn show(value: &Value, shown: Option<&str>) -> String {
    shown.map_or_else(|| value.to_string(), str::to_string)
}

/// Checks one option's value and returns it normalised: seconds as the number given,
/// a choice or a flavour as its name (`null` for a flavour that is off), a boolean as
/// itself, text as itself; [`Kind::Key`] and [`Kind::Method`] values unchanged. `null`
/// (unset) is returned as `null` for every kind: the caller applies the default.
///
/// `job` names the job in the message (empty: a setting), `prefix` is how the door
/// spells option names (`idempotency_`), `shown` the value as the host language
/// writes it (for the message; `None`: its JSON).
///
/// Errors: [`Error::Config`] naming the job, the option and what it must be, for an
/// unknown name (see [`unknown`]) or a value of the wrong kind or out of range.
pub fn check(
    job: &str,
    prefix: &str,
    name: &str,
    value: &Value,
    shown: Option<&str>,
) -> Result<Value> {
    let option = find(name).ok_or_else(|| unknown(job, prefix, name))?;
    if value.is_null() {
        return Ok(Value::Null);
    }
    check_kind(
        &format!("{}{prefix}{name}", owner(job)),
        option.kind,
        value,
        shown,
    )
}

/// Checks `value` (`null` too: refused by every kind but [`Kind::Key`] and
/// [`Kind::Method`], which pass anything through) against `kind` and returns it
/// normalised as [`check`] does. `subject` is what the message names: the option or
/// setting as written, after its job (`"ChargeJob: idempotency_lease"`,
/// `"connect_timeout"`); `shown` the value as the host language writes it (`None`: its
/// JSON). The one wording of every option's and setting's rule.
///
/// Errors: [`Error::Config`] "`subject` must be …, got `shown`".
pub fn check_kind(subject: &str, kind: Kind, value: &Value, shown: Option<&str>) -> Result<Value> {
    let bad = |expected: String| {
        Error::Config(format!(
            "{subject} must be {expected}, got {}",
            show(value, shown)
        ))
    };
    match kind {
        Kind::Key | Kind::Method => Ok(value.clone()),
        Kind::Text => match value.as_str() {
            Some("") => Err(Error::Config(format!("{subject} must not be empty"))),
            Some(_) => Ok(value.clone()),
            None => Err(bad("a non-empty string".into())),
        },
        Kind::Seconds {
            min,
            min_inclusive,
            why_min,
            max,
            why_max,
        } => {
            let seconds = value
                .as_f64()
                .filter(|s| s.is_finite() && *s > 0.0 && *s <= max)
                .ok_or_else(|| {
                    bad(format!(
                        "a positive number of seconds up to {} ({why_max})",
                        seconds_json(max)
                    ))
                })?;
            if seconds < min || (!min_inclusive && seconds == min) {
                return Err(Error::Config(format!(
                    "{subject} must be at least {min} s ({why_min}), got {}",
                    show(value, shown)
                )));
            }
            Ok(value.clone())
        }
        Kind::Choice { allowed } => match value.as_str() {
            Some(s) if allowed.contains(&s) => Ok(value.clone()),
            _ => Err(bad(format!("one of {}", allowed.join(", ")))),
        },
        Kind::Boolean => match value {
            Value::Bool(_) => Ok(value.clone()),
            _ => Err(bad("true or false".into())),
        },
        Kind::Flavour { on, allowed } => match value {
            Value::Bool(true) => Ok(json!(on)),
            Value::Bool(false) => Ok(Value::Null),
            Value::String(s) if allowed.contains(&s.as_str()) => Ok(value.clone()),
            _ => Err(bad(format!("true, false or one of {}", allowed.join(", ")))),
        },
        Kind::Count { min, max, why_max } => match value.as_i64() {
            Some(n) if (min..=max).contains(&n) => Ok(value.clone()),
            _ if why_max.is_empty() => Err(bad(format!("a whole number from {min} to {max}"))),
            _ => Err(bad(format!(
                "a whole number from {min} to {max} ({why_max})"
            ))),
        },
    }
}
