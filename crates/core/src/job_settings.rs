//! Job options from settings: a job's (or `configure`'s) options as one JSON object,
//! each value checked by the core's table ([`crate::options`]) and set on the field it
//! names, so no binding maps option names to [`JobOptions`] fields by hand; and the
//! settings that give every job its defaults ([`JobDefaults`]: each option's setting,
//! `defer_margin`, `retention`), read and answered by name.

use serde_json::{json, Map, Value};

use crate::config::{must_be_set, DEFAULT_RETENTION_SECONDS};
use crate::error::{Error, Result};
use crate::options::{self, MAX_SECONDS};
use crate::protocol::{JobOptions, OnMismatch, OnStale};

/// One job option the protocol reads: its name in the core's table and how its
/// [`JobOptions`] field is read and set (from a value [`options::check`] returned; `job`
/// names the job in errors). The one place an option name meets a field.
struct Field {
    name: &'static str,
    get: fn(&JobOptions) -> Value,
    set: fn(&mut JobOptions, &str, &Value) -> Result<()>,
}

fn seconds(checked: &Value) -> f64 {
    checked.as_f64().unwrap_or(f64::NAN)
}

/// Every option the protocol reads; the door's (`key`, `scope`, `transaction`,
/// `on_enqueue`) and `lookup` (a label: see [`JobOptions::from_settings`]) are not here.
const FIELDS: &[Field] = &[
    Field {
        name: "lease",
        get: |o| json!(o.lease_seconds),
        set: |o, _, v| {
            o.lease_seconds = seconds(v);
            Ok(())
        },
    },
    Field {
        name: "on_stale",
        get: |o| json!(o.on_stale.as_str()),
        set: |o, job, v| {
            o.on_stale = OnStale::parse(job, v.as_str().unwrap_or(""))?;
            Ok(())
        },
    },
    Field {
        name: "on_mismatch",
        get: |o| json!(o.on_mismatch.as_str()),
        set: |o, job, v| {
            o.on_mismatch = OnMismatch::parse(job, v.as_str().unwrap_or(""))?;
            Ok(())
        },
    },
    Field {
        name: "heartbeat",
        get: |o| json!(o.heartbeat),
        set: |o, _, v| {
            o.heartbeat = v.as_bool().unwrap_or(o.heartbeat);
            Ok(())
        },
    },
    Field {
        name: "max_run",
        get: |o| json!(o.max_run_seconds),
        set: |o, _, v| {
            o.max_run_seconds = seconds(v);
            Ok(())
        },
    },
    Field {
        name: "lock_timeout",
        get: |o| json!(o.lock_timeout_seconds),
        set: |o, _, v| {
            o.lock_timeout_seconds = seconds(v);
            Ok(())
        },
    },
    Field {
        name: "store_result",
        get: |o| json!(o.store_result),
        set: |o, _, v| {
            o.store_result = v.as_bool().unwrap_or(false);
            Ok(())
        },
    },
    Field {
        name: "max_takeovers",
        get: |o| json!(o.max_takeovers),
        set: |o, _, v| {
            o.max_takeovers = v.as_i64().and_then(|n| i32::try_from(n).ok());
            Ok(())
        },
    },
];

impl JobOptions {
    /// Sets the field of option `name` from `checked`, a value [`options::check`] has
    /// returned (`null`: unset, the field keeps its value). The options that are the
    /// door's and not the protocol's (`key`, `scope`, `transaction`, `on_enqueue`) and
    /// `lookup` (a label: see [`JobOptions::from_settings`]) are left alone. `job`
    /// names the job in errors (empty: `configure`).
    ///
    /// Errors: [`Error::Config`] for a stale or mismatch policy nobody knows.
    pub fn apply(&mut self, job: &str, name: &str, checked: &Value) -> Result<()> {
        if checked.is_null() {
            return Ok(());
        }
        let named = if job.is_empty() { "configure" } else { job };
        match FIELDS.iter().find(|f| f.name == name) {
            Some(field) => (field.set)(self, named, checked),
            None => Ok(()),
        }
    }

    /// The value of option `name` as JSON (seconds as numbers, a policy by name), or
    /// `null` for an option the protocol does not read (the door's, `lookup`).
    pub fn value_of(&self, name: &str) -> Value {
        FIELDS
            .iter()
            .find(|f| f.name == name)
            .map_or(Value::Null, |field| (field.get)(self))
    }

    /// `base` with every option of `settings` applied: a JSON object by option name
    /// without the door's `prefix` (`null` values skipped), each checked by the core's
    /// table ([`options::check`]); `lookup` is the lookup's label (a string: how log
    /// lines name it) or `null`. The result is validated ([`JobOptions::validate`]).
    ///
    /// Errors: [`Error::Config`] naming the job and the option as the user wrote it
    /// (`prefix` + name): an unknown name (with the nearest known one), a value of the
    /// wrong kind or out of range, `settings` that is not an object.
    pub fn from_settings(
        job: &str,
        prefix: &str,
        settings: &Value,
        base: JobOptions,
    ) -> Result<JobOptions> {
        let Some(settings) = settings.as_object() else {
            return Err(Error::Config(format!(
                "{job}: the job options must be an object, got {settings}"
            )));
        };
        let mut resolved = base;
        for (name, value) in settings {
            if name == "lookup" {
                resolved.lookup = value.as_str().map(str::to_string);
                continue;
            }
            let checked = options::check(job, prefix, name, value, None)?;
            resolved.apply(job, name, &checked)?;
        }
        resolved.validate(job)?;
        Ok(resolved)
    }
}

/// The settings of the job defaults that are not a job option's setting: seconds added
/// to a deferral past the holder's lease, and how long a finished record is kept.
const OWN_SETTINGS: [&str; 2] = ["defer_margin", "retention"];

/// What `configure` sets for every job: the job options' defaults (each table option's
/// `setting`) and the `defer_margin` and `retention` settings, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDefaults {
    /// The options every job starts from (`defer_margin_seconds` included).
    pub options: JobOptions,
    /// Seconds a finished record is kept before a purge deletes it
    /// ([`DEFAULT_RETENTION_SECONDS`]).
    pub retention_seconds: f64,
}

impl Default for JobDefaults {
    fn default() -> Self {
        JobDefaults {
            options: JobOptions::default(),
            retention_seconds: DEFAULT_RETENTION_SECONDS,
        }
    }
}

impl JobDefaults {
    /// The setting names, in the table's order (each option's `setting`, less those of
    /// the options in `not_taken`: what a binding does not take), then `defer_margin`
    /// and `retention`.
    pub fn setting_names(not_taken: &[&str]) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = options::JOB_OPTIONS
            .iter()
            .filter(|o| !not_taken.contains(&o.name))
            .filter_map(|o| o.setting)
            .collect();
        names.extend(OWN_SETTINGS);
        names
    }

    /// Sets the setting `name` (one of [`JobDefaults::setting_names`]) from `value`,
    /// checked: an option's setting by the core's table ([`options::check`], the message
    /// naming the setting); `defer_margin` and `retention` a number of seconds from 0 to
    /// [`MAX_SECONDS`]. `null` leaves it.
    ///
    /// Errors: [`Error::Config`] for a bad value or a name that is no such setting.
    pub fn set(&mut self, name: &str, value: &Value) -> Result<()> {
        if value.is_null() {
            return Ok(());
        }
        match name {
            "defer_margin" => self.options.defer_margin_seconds = own_seconds(name, value, None)?,
            "retention" => self.retention_seconds = own_seconds(name, value, None)?,
            _ => {
                let option = options::JOB_OPTIONS
                    .iter()
                    .find(|o| o.setting == Some(name))
                    .ok_or_else(|| Error::Config(format!("{name} is not a job default setting")))?;
                let checked = options::check("", "", option.name, value, None)?;
                self.options.apply("", option.name, &checked)?;
            }
        }
        Ok(())
    }

    /// `value` checked for the setting `name` (one of [`JobDefaults::setting_names`]),
    /// nothing set: what [`JobDefaults::set`] accepts, for a binding that keeps the
    /// settings itself (the Ruby gem's `Configuration`). An option's setting is checked
    /// by the core's table ([`options::check`]: its checked value; `null` is refused by
    /// [`must_be_set`], naming the table's default); `defer_margin` and `retention` must
    /// be a number of seconds from 0 to [`MAX_SECONDS`] (`null` too is refused). `shown` is how messages show the value
    /// (the caller's own notation), else its JSON.
    ///
    /// Errors: [`Error::Config`] naming the setting, for a bad value or a name that is
    /// no such setting.
    pub fn check(name: &str, value: &Value, shown: Option<&str>) -> Result<Value> {
        if OWN_SETTINGS.contains(&name) {
            return own_seconds(name, value, shown).map(|v| json!(v));
        }
        let option = options::JOB_OPTIONS
            .iter()
            .find(|o| o.setting == Some(name))
            .ok_or_else(|| Error::Config(format!("{name} is not a job default setting")))?;
        if value.is_null() {
            return Err(must_be_set(
                name,
                &options::default_json(option.default),
                shown,
            ));
        }
        options::check("", "", option.name, value, shown)
    }

    /// The job defaults of `settings` (a JSON object of `configure`'s keyword
    /// arguments) over the core's defaults, each set by [`JobDefaults::set`] and then
    /// validated; and the other settings (the connection's, or unknown ones, `null`
    /// values kept: the caller judges them), in their order.
    ///
    /// Errors: [`Error::Config`] for a bad value of a job default setting, `null` too
    /// (as [`JobDefaults::check`] refuses it: "lease must be set (its default is 300),
    /// got null").
    pub fn from_settings(
        settings: Map<String, Value>,
        not_taken: &[&str],
    ) -> Result<(JobDefaults, Map<String, Value>)> {
        let names = JobDefaults::setting_names(not_taken);
        let mut defaults = JobDefaults::default();
        let mut rest = Map::new();
        for (name, value) in settings {
            if names.contains(&name.as_str()) {
                if value.is_null() {
                    // Refused in the Ruby gem's words (`c.lease = nil`): the core's rule.
                    JobDefaults::check(&name, &value, None)?;
                }
                defaults.set(&name, &value)?;
            } else {
                rest.insert(name, value);
            }
        }
        defaults.options.validate("configure")?;
        Ok((defaults, rest))
    }

    /// Every setting of [`JobDefaults::setting_names`] with its value as JSON, in that
    /// order (seconds as numbers, a policy by name).
    pub fn values(&self, not_taken: &[&str]) -> Vec<(&'static str, Value)> {
        JobDefaults::setting_names(not_taken)
            .into_iter()
            .map(|name| {
                let value = match name {
                    "defer_margin" => json!(self.options.defer_margin_seconds),
                    "retention" => json!(self.retention_seconds),
                    _ => {
                        let option = options::JOB_OPTIONS
                            .iter()
                            .find(|o| o.setting == Some(name));
                        option.map_or(Value::Null, |o| self.options.value_of(o.name))
                    }
                };
                (name, value)
            })
            .collect()
    }
}

/// A number of seconds for `defer_margin` or `retention`: finite, from 0 to
/// [`MAX_SECONDS`]; `shown` is how the message shows a refused value (else its JSON).
fn own_seconds(name: &str, value: &Value, shown: Option<&str>) -> Result<f64> {
    match value.as_f64() {
        Some(v) if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) => Ok(v),
        _ => {
            let shown = shown.map_or_else(|| value.to_string(), str::to_string);
            Err(Error::Config(format!(
                "{name} must be a number of seconds from 0 to {MAX_SECONDS}, got {shown}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_set_the_fields_they_name() {
        let options = JobOptions::from_settings(
            "J",
            "idempotency_",
            &json!({"lease": 60, "on_stale": "hold", "heartbeat": false, "lookup": "lookup find",
                    "store_result": true, "key": "order_id", "max_run": null,
                    "max_takeovers": 2}),
            JobOptions::default(),
        )
        .unwrap();
        assert_eq!(options.lease_seconds, 60.0);
        assert_eq!(options.on_stale, OnStale::Hold);
        assert!(!options.heartbeat && options.store_result);
        assert_eq!(options.lookup.as_deref(), Some("lookup find"));
        assert_eq!(options.max_takeovers, Some(2));
        assert_eq!(
            options.max_run_seconds,
            JobOptions::default().max_run_seconds
        );
    }

    #[test]
    fn a_bad_or_unknown_option_is_refused_by_name() {
        let err = |settings: Value| {
            JobOptions::from_settings("J", "idempotency_", &settings, JobOptions::default())
                .unwrap_err()
                .to_string()
        };
        assert!(err(json!({"leese": 60})).contains("did you mean idempotency_lease?"));
        assert!(err(json!({"lease": 0.1})).contains("idempotency_lease must be at least 0.25 s"));
        assert!(err(json!([1])).contains("must be an object"));
    }

    #[test]
    fn check_takes_what_set_takes_and_sets_nothing() {
        assert_eq!(
            JobDefaults::check("retention", &json!(0), None).unwrap(),
            json!(0.0)
        );
        let err = JobDefaults::check("defer_margin", &json!(-1), Some("-1 (Integer)"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("defer_margin must be a number of seconds from 0 to"),
            "{err}"
        );
        assert!(err.ends_with("got -1 (Integer)"), "{err}");
        assert!(JobDefaults::check("retention", &Value::Null, None).is_err());
        assert!(JobDefaults::check("lease", &json!(0.1), None).is_err());
        assert_eq!(
            JobDefaults::check("on_stale", &json!("hold"), None).unwrap(),
            json!("hold")
        );
        assert!(JobDefaults::check("leese", &json!(1), None).is_err());
    }

    #[test]
    fn every_field_is_an_option_of_the_table_and_every_setting_has_a_field() {
        for field in FIELDS {
            assert!(options::find(field.name).is_some(), "{}", field.name);
        }
        for option in options::JOB_OPTIONS.iter().filter(|o| o.setting.is_some()) {
            assert!(
                FIELDS.iter().any(|f| f.name == option.name),
                "{}",
                option.name
            );
        }
    }

    #[test]
    fn the_job_defaults_are_read_and_answered_by_setting_name() {
        let (defaults, rest) = JobDefaults::from_settings(
            json!({"lease": 60, "on_stale": "hold", "retention": 10, "defer_margin": 2.5,
                   "pool_size": 3})
            .as_object()
            .unwrap()
            .clone(),
            &["lock_timeout"],
        )
        .unwrap();
        assert_eq!(rest, *json!({"pool_size": 3}).as_object().unwrap());
        let answered = defaults.values(&["lock_timeout"]);
        assert_eq!(
            answered,
            vec![
                ("lease", json!(60.0)),
                ("on_stale", json!("hold")),
                ("on_mismatch", json!("log")),
                ("heartbeat", json!(true)),
                ("max_run", json!(3600.0)),
                ("defer_margin", json!(2.5)),
                ("retention", json!(10.0)),
            ]
        );
        let refused = |settings: Value| {
            JobDefaults::from_settings(settings.as_object().unwrap().clone(), &[])
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(json!({"retention": -1})),
            "retention must be a number of seconds from 0 to 315360000, got -1"
        );
        assert!(refused(json!({"lease": 0.1})).contains("lease must be at least 0.25 s"));
        // Unset is refused naming the table's default, in the Ruby gem's words
        // (`c.heartbeat = nil`); Python's None skipped it before.
        assert_eq!(
            refused(json!({"heartbeat": null})),
            "heartbeat must be set (its default is true), got null"
        );
        assert_eq!(
            refused(json!({"on_stale": null})),
            r#"on_stale must be set (its default is "reclaim"), got null"#
        );
        assert_eq!(
            JobDefaults::check("lease", &Value::Null, Some("nil"))
                .unwrap_err()
                .to_string(),
            "lease must be set (its default is 300), got nil"
        );
        // A connection setting's null is the caller's to judge (Config::from_json).
        let (_, rest) = JobDefaults::from_settings(
            json!({"connect_timeout": null})
                .as_object()
                .unwrap()
                .clone(),
            &[],
        )
        .unwrap();
        assert_eq!(rest, *json!({"connect_timeout": null}).as_object().unwrap());
    }
}
