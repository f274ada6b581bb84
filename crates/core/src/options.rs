//! The options a job declares (the operation key, its lease, its stale policy…): each
//! option's name, kind, allowed values, limits and default, stated once here for every
//! binding and door. A door spells the names its own way (the Sidekiq door prefixes
//! them `idempotency_`, ActiveJob's `idempotency` and the plain API take them bare,
//! Celery's task options are prefixed too); it hands that prefix in, so messages name
//! the option as the user wrote it.
//!
//! Bindings read the table ([`JOB_OPTIONS`], or [`table_json`] as JSON) instead of
//! restating it, check each value with [`check`] and refuse an unknown name with
//! [`unknown`] (which suggests the nearest known name). Options whose value only the
//! host language can judge — the operation key declaration (it names parameters of
//! the job's method) and the lookup (a method or a callable) — are of kinds
//! [`Kind::Key`] and [`Kind::Method`]: [`check`] passes them through unchanged.
//!
//! To add an option: add one [`JobOption`] to [`JOB_OPTIONS`] (and, for a new kind of
//! value, a [`Kind`]); the bindings pick it up from the table.

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// Shortest lease accepted, in seconds: below it a heartbeat cannot renew in time (one
/// statement round trip and a thread wake-up) and every delivery looks stale.
pub const MIN_LEASE_SECONDS: f64 = 0.25;
/// Longest duration accepted for a job option or a setting, in seconds (ten years).
pub const MAX_SECONDS: f64 = MAX_LEASE_SECONDS;

/// PostgreSQL's limit for `statement_timeout` and `lock_timeout` (INT_MAX ms), in seconds
/// (re-exported as `config::MAX_PG_TIMEOUT_SECONDS`).
pub const MAX_PG_TIMEOUT_SECONDS: f64 = 2_147_483.0;

/// Longest lease accepted, in seconds (ten years; PostgreSQL intervals overflow far
/// beyond that; re-exported as `config::MAX_LEASE_SECONDS`).
pub const MAX_LEASE_SECONDS: f64 = 315_360_000.0;

/// What values an option takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// The operation key declaration (a parameter name, an argument index, a dotted
    /// path or a list of those): checked by the binding against the job's method.
    Key,
    /// A non-empty string (the job type stored in the record).
    Text,
    /// A number of seconds: above `min` (or equal to it when `min_inclusive`), at most
    /// `max`; `why_min` explains a minimum above zero.
    Seconds {
        min: f64,
        min_inclusive: bool,
        why_min: &'static str,
        max: f64,
        why_max: &'static str,
    },
    /// One of `allowed` (a symbol or a string in the host language).
    Choice { allowed: &'static [&'static str] },
    /// `true` or `false` (never a string: `"false"` is refused).
    Boolean,
    /// Off (`false` or unset), `true` (meaning `on`), or one of `allowed` by name.
    Flavour {
        on: &'static str,
        allowed: &'static [&'static str],
    },
    /// A method of the job by name, or a callable: checked by the binding.
    Method,
    /// A whole number from `min` to `max` (a count, never a string or a fraction);
    /// `why_max` explains the maximum ("" for none).
    Count {
        min: i64,
        max: i64,
        why_max: &'static str,
    },
}

/// A default value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// Not set: the option is off or absent.
    None,
    /// The job's name (its class name).
    JobName,
    /// A number of seconds.
    Seconds(f64),
    /// A choice's name.
    Choice(&'static str),
    /// A boolean.
    Boolean(bool),
}

/// One job option.
#[derive(Debug, Clone, Copy)]
pub struct JobOption {
    /// The option's name without a door's prefix (`lease`, `on_stale`).
    pub name: &'static str,
    /// What values it takes.
    pub kind: Kind,
    /// Its value when neither the job nor the settings set it.
    pub default: Default,
    /// The setting of the same meaning that gives every job its default (e.g. the
    /// `lease` setting of `IdempotentJob.configure`), if there is one.
    pub setting: Option<&'static str>,
    /// Whether a job must declare it (only the key).
    pub required: bool,
    /// One line saying what it does.
    pub doc: &'static str,
}

/// The policies for a stale claim, chosen in advance.
pub const STALE_POLICIES: &[&str] = &["reclaim", "hold", "skip"];
/// What a delivery whose payload differs from the claim's does.
pub const MISMATCH_POLICIES: &[&str] = &["log", "raise"];
/// What a producer's push of an operation already completed does (reject at enqueue).
pub const ENQUEUE_POLICIES: &[&str] = &["push", "skip_completed"];
/// The transactional flavours (`true` means native).
pub const TRANSACTIONS: &[&str] = &["native", "active_record"];

/// A positive number of seconds up to [`MAX_SECONDS`]: the rule of every duration,
/// job option or setting, PostgreSQL does not bound ([`PG_TIMEOUT`]).
pub const DURATION: Kind = Kind::Seconds {
    min: 0.0,
    min_inclusive: false,
    why_min: "",
    max: MAX_SECONDS,
    why_max: "ten years",
};

/// A positive number of seconds up to PostgreSQL's limit for `statement_timeout` and
/// `lock_timeout` ([`MAX_PG_TIMEOUT_SECONDS`]).
pub const PG_TIMEOUT: Kind = Kind::Seconds {
    min: 0.0,
    min_inclusive: false,
    why_min: "",
    max: MAX_PG_TIMEOUT_SECONDS,
    why_max: "PostgreSQL's limit",
};

/// Every job option, in the order messages list them.
pub const JOB_OPTIONS: &[JobOption] = &[
    JobOption {
        name: "key",
        kind: Kind::Key,
        default: Default::None,
        setting: None,
        required: true,
        doc: "the operation key: a parameter name, an argument index, a dotted path, or a list of those",
    },
    JobOption {
        name: "scope",
        kind: Kind::Text,
        default: Default::JobName,
        setting: None,
        required: false,
        doc: "the job type stored in the record (default the job's class name)",
    },
    JobOption {
        name: "lease",
        kind: Kind::Seconds {
            min: MIN_LEASE_SECONDS,
            min_inclusive: true,
            why_min: "a shorter lease cannot be renewed in time",
            max: MAX_SECONDS,
            why_max: "ten years",
        },
        default: Default::Seconds(300.0),
        setting: Some("lease"),
        required: false,
        doc: "seconds a claim is held before it is stale (renewed by the heartbeat)",
    },
    JobOption {
        name: "on_stale",
        kind: Kind::Choice {
            allowed: STALE_POLICIES,
        },
        default: Default::Choice("reclaim"),
        setting: Some("on_stale"),
        required: false,
        doc: "a stale claim: reclaim (run again), hold (for a person), skip (give up)",
    },
    JobOption {
        name: "on_mismatch",
        kind: Kind::Choice {
            allowed: MISMATCH_POLICIES,
        },
        default: Default::Choice("log"),
        setting: Some("on_mismatch"),
        required: false,
        doc: "a delivery whose payload differs from the claim's: log it, or raise",
    },
    JobOption {
        name: "lookup",
        kind: Kind::Method,
        default: Default::None,
        setting: None,
        required: false,
        doc: "a method (or callable) asked whether a stale claim's effect happened: done, not_done, unknown",
    },
    JobOption {
        name: "heartbeat",
        kind: Kind::Boolean,
        default: Default::Boolean(true),
        setting: Some("heartbeat"),
        required: false,
        doc: "renew the lease while the body runs",
    },
    JobOption {
        name: "max_run",
        kind: DURATION,
        default: Default::Seconds(3600.0),
        setting: Some("max_run"),
        required: false,
        doc: "seconds after which the heartbeat stops renewing (a hung body loses its claim)",
    },
    JobOption {
        name: "transaction",
        kind: Kind::Flavour {
            on: "native",
            allowed: TRANSACTIONS,
        },
        default: Default::None,
        setting: None,
        required: false,
        doc: "commit the body's statements with the claim: true (native) or active_record",
    },
    JobOption {
        name: "lock_timeout",
        kind: PG_TIMEOUT,
        default: Default::Seconds(5.0),
        setting: Some("lock_timeout"),
        required: false,
        doc: "seconds a transactional claim waits for another delivery's transaction",
    },
    JobOption {
        name: "store_result",
        kind: Kind::Boolean,
        default: Default::Boolean(false),
        setting: None,
        required: false,
        doc: "store the body's return value as JSON with the completion, so a repeat replays it",
    },
    JobOption {
        name: "on_enqueue",
        kind: Kind::Choice {
            allowed: ENQUEUE_POLICIES,
        },
        default: Default::Choice("push"),
        setting: None,
        required: false,
        doc: "a producer's push of a completed operation: push it, or skip_completed (push nothing)",
    },
    JobOption {
        name: "max_takeovers",
        kind: Kind::Count {
            min: 0,
            max: MAX_TAKEOVERS,
            why_max: "",
        },
        default: Default::None,
        setting: None,
        required: false,
        doc: "stale takeovers of one operation before the next is held for a person (after its lookup) instead of reclaimed",
    },
];

/// Largest `max_takeovers` accepted (the record counts takeovers in a 32-bit integer).
pub const MAX_TAKEOVERS: i64 = i32::MAX as i64 - 1;

/// The option named `name` (without a prefix).
pub fn find(name: &str) -> Option<&'static JobOption> {
    JOB_OPTIONS.iter().find(|o| o.name == name)
}

/// The default as JSON (`null` for none and for [`Default::JobName`], which the
/// binding fills in).
fn default_json(default: Default) -> Value {
    match default {
        Default::None | Default::JobName => Value::Null,
        Default::Seconds(s) => seconds_json(s),
        Default::Choice(c) => json!(c),
        Default::Boolean(b) => json!(b),
    }
}

/// A whole number of seconds as an integer, else as a float.
fn seconds_json(seconds: f64) -> Value {
    if seconds.fract() == 0.0 && seconds.abs() < 9.0e15 {
        json!(seconds as i64)
    } else {
        json!(seconds)
    }
}

/// The table as JSON, for bindings that read it at load: an object by option name,
/// each `{"kind", "default", "default_is_job_name", "setting", "required", "doc"}`
/// plus `"allowed"` (choices, flavours), `"on"` (flavours), `"min"`,
/// `"min_inclusive"`, `"max"` (seconds). Keys in [`JOB_OPTIONS`] order.
pub fn table_json() -> Value {
    let mut table = serde_json::Map::new();
    for option in JOB_OPTIONS {
        let mut entry = serde_json::Map::new();
        let kind = match option.kind {
            Kind::Key => "key",
            Kind::Text => "text",
            Kind::Seconds {
                min,
                min_inclusive,
                max,
                ..
            } => {
                entry.insert("min".into(), seconds_json(min));
                entry.insert("min_inclusive".into(), json!(min_inclusive));
                entry.insert("max".into(), seconds_json(max));
                "seconds"
            }
            Kind::Choice { allowed } => {
                entry.insert("allowed".into(), json!(allowed));
                "choice"
            }
            Kind::Boolean => "boolean",
            Kind::Flavour { on, allowed } => {
                entry.insert("on".into(), json!(on));
                entry.insert("allowed".into(), json!(allowed));
                "flavour"
            }
            Kind::Method => "method",
            Kind::Count { min, max, .. } => {
                entry.insert("min".into(), json!(min));
                entry.insert("max".into(), json!(max));
                "count"
            }
        };
        entry.insert("kind".into(), json!(kind));
        entry.insert("default".into(), default_json(option.default));
        entry.insert(
            "default_is_job_name".into(),
            json!(option.default == Default::JobName),
        );
        entry.insert("setting".into(), json!(option.setting));
        entry.insert("required".into(), json!(option.required));
        entry.insert("doc".into(), json!(option.doc));
        table.insert(option.name.into(), Value::Object(entry));
    }
    Value::Object(table)
}

/// How the user's value is shown in a message: `shown` when the binding gives its own
/// spelling (Ruby's `inspect`), else the JSON text.
fn show(value: &Value, shown: Option<&str>) -> String {
    shown.map_or_else(|| value.to_string(), str::to_string)
}

fn owner(job: &str) -> String {
    if job.is_empty() {
        String::new()
    } else {
        format!("{job}: ")
    }
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

/// The known name nearest to `name` (both without a prefix), if one is close enough
/// to be a likely misspelling.
pub fn suggestion(name: &str) -> Option<&'static str> {
    let names: Vec<&'static str> = JOB_OPTIONS.iter().map(|o| o.name).collect();
    nearest(name, &names)
}

/// The name of `known` nearest to `name`, if one is close enough to be a likely
/// misspelling (Jaro-Winkler similarity 0.8 or more), or one that `name` ends with
/// after an underscore (a door's prefix written where none is taken:
/// `idempotency_lease` for `lease`).
pub fn nearest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    if let Some(found) = known.iter().find(|k| {
        name.strip_suffix(**k)
            .is_some_and(|head| head.ends_with('_'))
    }) {
        return Some(found);
    }
    known
        .iter()
        .map(|k| (*k, strsim::jaro_winkler(name, k)))
        .filter(|(_, score)| *score >= 0.8)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, _)| n)
}

/// The error for an option name nobody knows: names the job, the option as written
/// (`prefix` + `name`), the nearest known one ("did you mean …?") and every known one.
pub fn unknown(job: &str, prefix: &str, name: &str) -> Error {
    let names: Vec<&str> = JOB_OPTIONS.iter().map(|o| o.name).collect();
    unknown_among(job, prefix, name, &names)
}

/// [`unknown`] for a door or binding that takes only some of the options (`known`,
/// without a prefix): suggests and lists only those.
pub fn unknown_among(job: &str, prefix: &str, name: &str, known: &[&str]) -> Error {
    let hint = nearest(name, known)
        .map(|s| format!(" (did you mean {prefix}{s}?)"))
        .unwrap_or_default();
    let listed: Vec<String> = known.iter().map(|o| format!("{prefix}{o}")).collect();
    Error::Config(format!(
        "{}unknown option {prefix}{name}{hint}; known options: {}",
        owner(job),
        listed.join(", ")
    ))
}

/// The error for a keyword a call does not take (the plain API's `perform_once`): names
/// the job, the call, the keyword as the host writes it (`shown`: Ruby's `:on_stael`),
/// the nearest of `known` and every one of them, each written with `suffix` (Ruby's
/// keyword colon, `lease:`; nothing in Python).
pub fn not_taken(
    job: &str,
    call: &str,
    shown: &str,
    name: &str,
    known: &[&str],
    suffix: &str,
) -> Error {
    let hint = nearest(name, known)
        .map(|s| format!(" (did you mean {s}{suffix}?)"))
        .unwrap_or_default();
    let listed: Vec<String> = known.iter().map(|k| format!("{k}{suffix}")).collect();
    Error::Config(format!(
        "{}{call} does not take {shown}{hint} (it takes {})",
        owner(job),
        listed.join(", ")
    ))
}

/// The error for a setting nobody knows: names it as the host wrote it (`shown`, e.g.
/// Ruby's `:leese`), the nearest of `known` ("did you mean lease?") and every known one.
pub fn unknown_setting(shown: &str, name: &str, known: &[&str]) -> Error {
    let hint = nearest(name, known)
        .map(|s| format!(" (did you mean {s}?)"))
        .unwrap_or_default();
    Error::Config(format!(
        "unknown idempotent_job setting {shown}{hint} (known: {})",
        known.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_unique_and_findable() {
        for option in JOB_OPTIONS {
            assert_eq!(find(option.name).unwrap().name, option.name);
        }
        let mut names: Vec<_> = JOB_OPTIONS.iter().map(|o| o.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), JOB_OPTIONS.len());
    }

    #[test]
    fn a_misspelled_name_gets_the_nearest_known_one() {
        let err = unknown("ChargeJob", "idempotency_", "on_stail").to_string();
        assert!(
            err.starts_with(
                "ChargeJob: unknown option idempotency_on_stail (did you mean idempotency_on_stale?)"
            ),
            "{err}"
        );
        assert!(err.contains("idempotency_lock_timeout"), "{err}");
        assert_eq!(suggestion("keys"), Some("key"));
        assert_eq!(suggestion("hearbeat"), Some("heartbeat"));
        assert_eq!(suggestion("zzz"), None);
        assert_eq!(suggestion("idempotency_lease"), Some("lease"));
        assert_eq!(
            not_taken(
                "Charge",
                "perform_once",
                ":on_stael",
                "on_stael",
                &["lease", "on_stale"],
                ":"
            )
            .to_string(),
            "Charge: perform_once does not take :on_stael (did you mean on_stale:?) (it takes \
             lease:, on_stale:)"
        );
        let err = unknown_among("T", "idempotency_", "leese", &["key", "lease"]).to_string();
        assert_eq!(
            err,
            "T: unknown option idempotency_leese (did you mean idempotency_lease?); known \
             options: idempotency_key, idempotency_lease"
        );
    }

    #[test]
    fn values_of_the_wrong_kind_are_refused_by_name() {
        let err = |name: &str, value: Value| {
            check("J", "idempotency_", name, &value, None)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("heartbeat", json!("false")),
            "J: idempotency_heartbeat must be true or false, got \"false\""
        );
        assert!(err("on_stale", json!("hodl")).contains("must be one of reclaim, hold, skip"));
        assert!(err("lease", json!(0.1)).contains("must be at least 0.25 s"));
        assert!(err("lease", json!("60")).contains("positive number of seconds"));
        assert!(err("lock_timeout", json!(3_000_000)).contains("PostgreSQL's limit"));
        assert!(err("scope", json!("")).contains("must not be empty"));
        assert!(err("transaction", json!("yes")).contains("true, false or one of"));
        assert!(err("max_takeovers", json!(-1)).contains("a whole number from 0 to"));
        assert!(err("max_takeovers", json!(2.5)).contains("a whole number from 0 to"));
        assert!(err("max_takeovers", json!("2")).contains("a whole number from 0 to"));
        assert_eq!(suggestion("max_takeover"), Some("max_takeovers"));
    }

    #[test]
    fn good_values_come_back_normalised() {
        let ok = |name: &str, value: Value| check("J", "", name, &value, None).unwrap();
        assert_eq!(ok("lease", json!(0.25)), json!(0.25));
        assert_eq!(ok("lease", json!(60)), json!(60));
        assert_eq!(ok("transaction", json!(true)), json!("native"));
        assert_eq!(ok("transaction", json!(false)), Value::Null);
        assert_eq!(ok("on_stale", json!("hold")), json!("hold"));
        assert_eq!(ok("heartbeat", Value::Null), Value::Null);
        assert_eq!(ok("key", json!(["a", 1])), json!(["a", 1]));
    }

    #[test]
    fn the_table_carries_kinds_limits_and_defaults() {
        let table = table_json();
        assert_eq!(table["lease"]["min"], json!(0.25));
        assert_eq!(table["lease"]["default"], json!(300));
        assert_eq!(
            table["on_stale"]["allowed"],
            json!(["reclaim", "hold", "skip"])
        );
        assert_eq!(table["scope"]["default_is_job_name"], json!(true));
        assert_eq!(table["key"]["required"], json!(true));
    }
}
