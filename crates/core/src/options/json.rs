//! The table as JSON for the bindings that read it at load ([`table_json`]).

use serde_json::{json, Value};

use super::table::{Default, Kind, JOB_OPTIONS};

/// The default as JSON (`null` for none and for [`Default::JobName`], which the
/// binding fills in).
pub(crate) fn default_json(default: Default) -> Value {
    match default {
        Default::None | Default::JobName => Value::Null,
        Default::Seconds(s) => seconds_json(s),
        Default::Choice(c) => json!(c),
        Default::Boolean(b) => json!(b),
    }
}

/// A whole number of seconds as an integer, else as a float.
pub(super) fn seconds_json(seconds: f64) -> Value {
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
