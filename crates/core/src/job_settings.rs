//! Job options from settings: a job's (or `configure`'s) options as one JSON object,
//! each value checked by the core's table ([`crate::options`]) and set on the field it
//! names, so no binding maps option names to [`JobOptions`] fields by hand.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::options;
use crate::protocol::{JobOptions, OnMismatch, OnStale};

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
        let text = || checked.as_str().unwrap_or("");
        let seconds = || checked.as_f64().unwrap_or(f64::NAN);
        match name {
            "lease" => self.lease_seconds = seconds(),
            "on_stale" => self.on_stale = OnStale::parse(named, text())?,
            "on_mismatch" => self.on_mismatch = OnMismatch::parse(named, text())?,
            "heartbeat" => self.heartbeat = checked.as_bool().unwrap_or(self.heartbeat),
            "max_run" => self.max_run_seconds = seconds(),
            "lock_timeout" => self.lock_timeout_seconds = seconds(),
            "store_result" => self.store_result = checked.as_bool().unwrap_or(false),
            "max_takeovers" => {
                self.max_takeovers = checked.as_i64().and_then(|n| i32::try_from(n).ok());
            }
            _ => {}
        }
        Ok(())
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
}
