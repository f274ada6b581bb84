//! `idempotent_job._native.Store`: one configured database (its pool built lazily and
//! rebuilt in a forked child: configured in Celery's parent, used in each pool child)
//! and the job defaults of `configure`. Internal: the public API is
//! `idempotent_job/__init__.py`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Map, Value};

use crate::convert;
use crate::errors::config;
use crate::gil::detached;
use crate::protocol::{self, JobProtocol, Outcome};
use idempotent_job_core::config::{check_setting, setting_rule, Config, CONNECTION_SETTINGS};
use idempotent_job_core::error::Error;
use idempotent_job_core::job_settings::JobDefaults;
use idempotent_job_core::protocol::{JobOptions, LookupAnswer, Protocol};
use idempotent_job_core::record::Field;
use idempotent_job_core::records::{self, Resolution};
use idempotent_job_core::store::{PoolHandle, Store as CoreStore};
use idempotent_job_core::{migrate, operations, options, repeats};

/// The core's job options the Python package does not take, and why: a door-only
/// fact (what this binding implements), not a restatement of the table.
pub const NOT_TAKEN: [&str; 3] = ["transaction", "lock_timeout", "on_enqueue"];

/// The job options the Python package takes, without a prefix, in the core's table
/// order ([`options::JOB_OPTIONS`] less [`NOT_TAKEN`]).
pub fn option_names() -> Vec<&'static str> {
    options::JOB_OPTIONS
        .iter()
        .map(|o| o.name)
        .filter(|n| !NOT_TAKEN.contains(n))
        .collect()
}

/// Checks one option by the core's table ([`options::check`]): `job` names the job (""
/// for a setting), `prefix` is how the door spells it, `shown` the value as Python
/// writes it when JSON cannot (None: its JSON). Returns the value normalised.
///
/// `without`: the options the calling door takes none of (the SQS door's `scope`: its
/// `job_type` is the record's job type), refused by the door itself and left out of the
/// known options an unknown name's message lists.
///
/// Errors: [`Error::Config`] for an unknown name (the nearest known one suggested,
/// [`options::unknown_among`]), an option the Python package does not take, or a bad
/// value.
pub fn check_option(
    job: &str,
    prefix: &str,
    name: &str,
    value: &Value,
    shown: Option<&str>,
    without: &[String],
) -> Result<Value, Error> {
    let owner = if job.is_empty() {
        String::new()
    } else {
        format!("{job}: ")
    };
    if NOT_TAKEN.contains(&name) {
        return Err(Error::Config(format!(
            "{owner}{prefix}{name} is not taken by the Python package (transactional claims \
             and on_enqueue are the Ruby gem's)"
        )));
    }
    if options::find(name).is_none() || without.iter().any(|w| w == name) {
        let known: Vec<&str> = option_names()
            .into_iter()
            .filter(|n| !without.iter().any(|w| w == n))
            .collect();
        return Err(options::unknown_among(job, prefix, name, &known));
    }
    options::check(job, prefix, name, value, shown)
}

/// A limit or batch size given as a Python int (`__init__.py` clamps it to 64 bits) as
/// an `i64`; anything else — a bool (`True` is not a count), a float such as `1.5`, a str
/// such as `"5"` — refused with `refused(its repr)`, the core's words (the Ruby gem's too).
fn whole(value: &Bound<'_, PyAny>, refused: impl Fn(&str) -> Error) -> PyResult<i64> {
    use pyo3::types::{PyBool, PyInt};
    if value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>() {
        return value.extract();
    }
    let shown = value
        .repr()
        .map_or_else(|_| "?".to_owned(), |r| r.to_string());
    Err(crate::errors::to_py(refused(&shown)))
}

/// One configured database and the job defaults.
#[pyclass(frozen, module = "idempotent_job._native")]
pub struct Store {
    core: CoreStore,
    /// The job defaults and the retention, as the core parsed them from `configure`.
    defaults: JobDefaults,
}

impl Store {
    fn pool(&self) -> PyResult<PoolHandle> {
        self.core.pool().map_err(crate::errors::to_py)
    }
}

impl Store {
    /// The defaults overridden by `options` (a dict of [`option_names`], unprefixed;
    /// None values are skipped), each checked by the core's table; `prefix` is how the
    /// door spells the names in messages.
    fn job_options(
        &self,
        job: &str,
        prefix: &str,
        options: &Bound<'_, PyDict>,
    ) -> PyResult<JobOptions> {
        let mut resolved = self.defaults.options.clone();
        for (name, value) in options.iter() {
            let name: String = name.extract()?;
            if value.is_none() {
                continue;
            }
            if name == "lookup" {
                if !value.is_callable() {
                    return Err(config(format!(
                        "{job}: {prefix}lookup must be callable (it gets the operation key and answers \
                         {}), got {}",
                        LookupAnswer::listed("\"", "\""),
                        convert::type_name(&value)
                    )));
                }
                let label = value
                    .getattr("__qualname__")
                    .or_else(|_| value.getattr("__name__"))
                    .map(|n| format!("lookup {n}"))
                    .unwrap_or_else(|_| "lookup".into());
                resolved.lookup = Some(label);
                continue;
            }
            let (json, shown) = option_json(&value)?;
            let checked = check_option(job, prefix, &name, &json, shown.as_deref(), &[])
                .map_err(crate::errors::to_py)?;
            resolved
                .apply(job, &name, &checked)
                .map_err(crate::errors::to_py)?;
        }
        resolved.validate(job).map_err(crate::errors::to_py)?;
        Ok(resolved)
    }
}

#[pymethods]
impl Store {
    /// `Store(settings_json)`: a JSON object of `configure`'s keyword arguments: the job
    /// defaults ([`JobDefaults::from_settings`]: checked by the core's table) and the
    /// connection settings of the core's `Config` ([`CONNECTION_SETTINGS`], each checked
    /// by its rule: [`idempotent_job_core::config::check_setting`], the Ruby gem's words);
    /// without `database_url`, the environment's (the core's
    /// [`idempotent_job_core::config::env_database_url`]). Validates everything; connects
    /// lazily.
    ///
    /// Raises `ConfigurationError` naming an unknown setting (with the nearest known
    /// one) or a bad value.
    #[new]
    fn new(settings_json: &str) -> PyResult<Self> {
        let parsed: Map<String, Value> =
            serde_json::from_str(settings_json).map_err(|e| config(format!("configure: {e}")))?;
        // A None is refused by the core's rule in Python's notation ("got None", as every
        // other value is shown by its repr; Ruby's "got nil"), not as the JSON it travels as.
        let job_defaults = JobDefaults::setting_names(&NOT_TAKEN);
        for (name, _) in parsed.iter().filter(|(_, value)| value.is_null()) {
            if job_defaults.contains(&name.as_str()) {
                JobDefaults::check(name, &Value::Null, Some("None"))
                    .map_err(crate::errors::to_py)?;
            } else if setting_rule(name).is_some() {
                check_setting(name, &Value::Null, Some("None")).map_err(crate::errors::to_py)?;
            }
        }
        let (defaults, mut native) =
            JobDefaults::from_settings(parsed, &NOT_TAKEN).map_err(crate::errors::to_py)?;
        if let Some(name) = native
            .keys()
            .find(|name| !CONNECTION_SETTINGS.contains(&name.as_str()))
        {
            let mut known = CONNECTION_SETTINGS.to_vec();
            known.extend(JobDefaults::setting_names(&NOT_TAKEN));
            return Err(crate::errors::to_py(options::unknown_setting(
                name, name, &known,
            )));
        }
        if native.get("database_url").is_none_or(Value::is_null) {
            if let Some(url) = idempotent_job_core::config::env_database_url() {
                native.insert("database_url".into(), Value::String(url));
            }
        }
        let core = Config::from_json(&Value::Object(native).to_string())
            .and_then(CoreStore::new)
            .map_err(crate::errors::to_py)?;
        Ok(Store { core, defaults })
    }

    /// The job defaults as a dict by setting name ([`JobDefaults::values`]: lease,
    /// on_stale, on_mismatch, heartbeat, max_run, defer_margin, retention; seconds as
    /// floats, policies as str).
    fn defaults<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, value) in self.defaults.values(&NOT_TAKEN) {
            match value {
                Value::Bool(b) => d.set_item(name, b)?,
                Value::Number(n) => d.set_item(name, n.as_f64())?,
                Value::String(text) => d.set_item(name, text)?,
                _ => d.set_item(name, py.None())?,
            }
        }
        Ok(d)
    }

    /// Applies the pending migrations (the same as the Ruby gem's, to the same table);
    /// returns the names of those applied now. Raises `MigrationError`.
    fn migrate(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let pool = self.pool()?;
        detached(py, move |i| migrate::migrate(&pool, i))
    }

    /// `held(job_type or None, limit)` → list of `(job_type, operation_key)` of held
    /// operations, oldest first.
    fn held(
        &self,
        py: Python<'_>,
        job_type: Option<String>,
        limit: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(String, String)>> {
        let limit = whole(limit, operations::held_limit_refused)?;
        let pool = self.pool()?;
        detached(py, move |i| {
            operations::held(&pool, i, job_type.as_deref(), limit)
        })
    }

    /// `resolve(job_type, operation_key, as_)`: `as_` is "done" (the effect happened:
    /// completed) or "rerun" (released for the next delivery), parsed by the core
    /// (`Resolution::parse`; anything else refused in its words, shown by `repr`). Returns None when the
    /// operation is not held or given up, else the stored delivery of its last claim (what
    /// a rerun re-sends) as a dict: `job_class`, `queue`, `args_json` (JSON text),
    /// `first_facts_json` (JSON object text), each str or None. Sent once (never
    /// repeated). ConfigurationError for a rerun of a record that holds no stored job (it
    /// stays as it was).
    fn resolve<'py>(
        &self,
        py: Python<'py>,
        job_type: String,
        operation_key: String,
        as_: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        // The core's names and words (the Ruby gem's `Native.resolution`), a refused
        // value shown by `repr`.
        let resolution = match as_.extract::<String>().map(|name| Resolution::parse(&name)) {
            Ok(Ok(resolution)) => resolution,
            _ => {
                let shown = as_.repr()?.to_string();
                return Err(crate::errors::to_py(Resolution::refused(&shown)));
            }
        };
        let pool = self.pool()?;
        let stored = detached(py, move |i| {
            operations::resolve_stored(&pool, i, &job_type, &operation_key, resolution)
        })?;
        let Some(stored) = stored else {
            return Ok(None);
        };
        let out = PyDict::new(py);
        out.set_item("job_class", stored.job_class)?;
        out.set_item("queue", stored.queue)?;
        out.set_item("args_json", stored.args_json)?;
        out.set_item("first_facts_json", stored.first_facts_json)?;
        Ok(Some(out))
    }

    /// `purge(older_than or None, batch)`: deletes finished (completed, given up)
    /// records older than `older_than` seconds (default: the `retention` setting) in
    /// batches of `batch`; returns how many went.
    #[pyo3(signature = (older_than, batch))]
    fn purge(
        &self,
        py: Python<'_>,
        older_than: Option<Bound<'_, PyAny>>,
        batch: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        // An age is a number of seconds by the core's rules (an int or a float; a bool or
        // a str is refused, never taken as 1 or 0 seconds).
        let older_than = match older_than {
            None => self.defaults.retention_seconds,
            Some(value) => convert::seconds(&value).ok_or_else(|| {
                crate::errors::to_py(records::purge_refused(
                    &convert::shown(&value),
                    &convert::shown(batch),
                ))
            })?,
        };
        let shown_age = older_than.to_string();
        let batch = whole(batch, |shown| records::purge_refused(&shown_age, shown))?;
        let mut total = 0;
        // Keyset batches: each starts after the last record the previous one took, and
        // the purge ends with the first batch that picks fewer records than its size.
        let mut cursor = records::PurgeCursor::default();
        loop {
            let pool = self.pool()?;
            let from = cursor.clone();
            let done = detached(py, move |i| {
                operations::purge_batch(&pool, i, older_than, batch, &from)
            })?;
            total += done.deleted;
            if done.picked < batch.max(0) as u64 {
                return Ok(total);
            }
            cursor = done.next;
        }
    }

    /// `find(job_type, operation_key)` → dict of the core's record fields
    /// (`Record::fields`: the Ruby Record's members too), by kind: str, int, float, bool,
    /// float epoch seconds for times, a list of str (job_classes), parsed JSON (args,
    /// result), None for NULL; or None when never claimed. Writes this process's queued
    /// repeat bookkeeping first.
    fn find<'py>(
        &self,
        py: Python<'py>,
        job_type: String,
        operation_key: String,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let pool = self.pool()?;
        let record = detached(py, move |i| {
            operations::find(&pool, i, &job_type, &operation_key)
        })?;
        let Some(record) = record else {
            return Ok(None);
        };
        let out = PyDict::new(py);
        for (name, field) in record.fields() {
            out.set_item(name, field_value(py, field)?)?;
        }
        Ok(Some(out))
    }

    /// `repeats(since, job_type or None, restarts, restart_window)` → JSON array text:
    /// operations repeated at or after `since` (epoch seconds), each with its repeats
    /// classified by the core ([`idempotent_job_core::repeats::operations`]; each
    /// element is [`idempotent_job_core::repeats::RepeatedOperation::to_json`]);
    /// `restarts` are deploy/restart times (epoch seconds), `restart_window` seconds.
    /// Reads `idempotent_job_records` (writes this process's queued bookkeeping first).
    /// ConfigurationError for a `since` out of range or a negative window.
    fn repeats(
        &self,
        py: Python<'_>,
        since: f64,
        job_type: Option<String>,
        restarts: Vec<f64>,
        restart_window: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        // A number of seconds by the core's rules (an int or a float): a bool, None or a
        // str is refused, never read as 1, 0 or "90" seconds.
        let restart_window = convert::seconds(restart_window)
            .ok_or_else(|| repeats::window_refused(&convert::shown(restart_window)))
            .map_err(crate::errors::to_py)?;
        repeats::check_window(restart_window).map_err(crate::errors::to_py)?;
        let since = repeats::check_time("since", Some(since), &since.to_string())
            .map_err(crate::errors::to_py)?;
        for &restart in &restarts {
            repeats::check_time("restarts", Some(restart), &restart.to_string())
                .map_err(crate::errors::to_py)?;
        }
        // In range (years 1 to 9999): chrono takes every such time.
        let since = chrono::DateTime::<chrono::Utc>::from_timestamp_micros((since * 1e6) as i64)
            .ok_or_else(|| {
                crate::errors::to_py(Error::Config(format!("since out of range: {since}")))
            })?;
        let pool = self.pool()?;
        let rows = detached(py, move |i| {
            operations::repeats(&pool, i, since, job_type.as_deref())
        })?;
        let ops =
            repeats::operations(rows, &restarts, restart_window).map_err(crate::errors::to_py)?;
        Ok(serde_json::Value::Array(
            ops.iter()
                .map(repeats::RepeatedOperation::to_json)
                .collect(),
        )
        .to_string())
    }

    /// Writes this process's queued repeat bookkeeping (duplicate counts); a no-op when
    /// this process never used the store. Called at exit.
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        let Some(pool) = self.core.built_pool() else {
            return Ok(());
        };
        detached(py, move |i| pool.bookkeeper().settle(&pool, i))
    }

    /// `operation_key(job, value)` → the operation key's text for one value (a str, an
    /// int, a non-empty dict or list); `operation_key(job, [values], composite=True)` for
    /// a composite key. Raises `OperationKeyError` naming `job`.
    #[staticmethod]
    #[pyo3(signature = (job, value, composite = false))]
    fn operation_key(
        py: Python<'_>,
        job: &str,
        value: &Bound<'_, PyAny>,
        composite: bool,
    ) -> PyResult<String> {
        let text = if composite {
            let values: Vec<Bound<'_, PyAny>> = value.try_iter()?.collect::<PyResult<_>>()?;
            convert::composite_text(&values)
        } else {
            convert::key_text(value)
        };
        crate::errors::checked_key(py, job, text)
    }

    /// `protocol(job, options, words, prefix="")` → the job's [`JobProtocol`]: `options`
    /// (a dict of [`option_names`], unprefixed, None values skipped) over the
    /// configured defaults, checked once by the core's table; `words` the door's words
    /// of its log lines (a dict of `id_label`, `defer_text`, `crash_text`; None: the
    /// plain API's, see [`protocol::words`]); `prefix` how the door spells option names
    /// in messages (`idempotency_`).
    ///
    /// Raises `ConfigurationError` naming `job` for an unknown option (with the nearest
    /// known one) or a bad value.
    #[pyo3(signature = (job, options, words, prefix = ""))]
    fn protocol(
        &self,
        job: &str,
        options: &Bound<'_, PyDict>,
        words: Option<&Bound<'_, PyDict>>,
        prefix: &str,
    ) -> PyResult<JobProtocol> {
        let resolved = self.job_options(job, prefix, options)?;
        let protocol =
            Protocol::new(job, resolved, protocol::words(words)?).map_err(crate::errors::to_py)?;
        Ok(JobProtocol { protocol })
    }

    /// Runs one delivery of `(job_type, operation_key)` through `protocol` (see
    /// `protocol::perform`): `body(claim)` runs at most once per operation; `payload` is
    /// any JSON value (digested to detect a payload mismatch); `lookup` the declared
    /// lookup callable (asked after a takeover); `id` this delivery's id; `deferrals`
    /// how often it met a live claim before.
    #[pyo3(signature = (protocol, job_type, operation_key, body, payload, id=None, deferrals=0, job_class=None, queue=None, facts=None, lookup=None, wait=None))]
    #[allow(clippy::too_many_arguments)]
    fn perform_once(
        &self,
        py: Python<'_>,
        protocol: &JobProtocol,
        job_type: String,
        operation_key: String,
        body: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
        id: Option<String>,
        deferrals: u32,
        job_class: Option<String>,
        queue: Option<String>,
        facts: Option<&Bound<'_, PyDict>>,
        lookup: Option<&Bound<'_, PyAny>>,
        wait: Option<f64>,
    ) -> PyResult<Outcome> {
        if job_type.is_empty() {
            return Err(config("perform_once: the job type must not be empty"));
        }
        if let Some(seconds) = wait {
            idempotent_job_core::results::check_wait(&job_type, Some(seconds), None)
                .map_err(crate::errors::to_py)?;
        }
        let mut delivery = protocol::request(
            job_type,
            operation_key,
            id,
            deferrals,
            job_class,
            queue,
            payload,
            facts,
        )?;
        // A live claim is waited for (at most `wait` seconds, no pooled connection held):
        // the core's Protocol::wait, after begin answers in progress.
        delivery.wait_seconds = wait;
        // Everything before the body ends within `wait` + the core's margin.
        delivery.bound_wait();
        protocol::perform(
            py,
            self.pool()?,
            self.core.config().asynchronous_completion,
            self.core.config().max_result_bytes,
            &protocol.protocol,
            delivery,
            lookup,
            body,
        )
    }
}

/// A record field's value (its [`Field`] kind) as a Python object.
fn field_value(py: Python<'_>, field: Field<'_>) -> PyResult<Py<PyAny>> {
    let epoch = |t: &chrono::DateTime<chrono::Utc>| t.timestamp_micros() as f64 / 1e6;
    Ok(match field {
        Field::Text(v) | Field::Name(v) => v.into_pyobject(py)?.into_any().unbind(),
        Field::OptText(v) | Field::OptName(v) => v.into_pyobject(py)?.into_any().unbind(),
        Field::Texts(v) => v.into_pyobject(py)?.into_any().unbind(),
        Field::Json(None) => py.None(),
        Field::Json(Some(text)) => py.import("json")?.call_method1("loads", (text,))?.unbind(),
        Field::Int(v) => v.into_pyobject(py)?.into_any().unbind(),
        Field::Float(v) => v.into_pyobject(py)?.into_any().unbind(),
        Field::Bool(v) => pyo3::types::PyBool::new(py, *v)
            .to_owned()
            .into_any()
            .unbind(),
        Field::Token(v) => v.to_string().into_pyobject(py)?.into_any().unbind(),
        Field::Time(v) => epoch(v).into_pyobject(py)?.into_any().unbind(),
        Field::OptTime(v) => v.as_ref().map(epoch).into_pyobject(py)?.into_any().unbind(),
    })
}

/// `check_option(job, prefix, name, value, without=())` → `value`, checked by the core's
/// options table ([`check_option`]; `without`: the options the door takes none of).
/// Raises `ConfigurationError` naming `job`, `prefix` + `name` and the problem (an
/// unknown name gets the nearest known one).
#[pyfunction]
#[pyo3(name = "check_option", signature = (job, prefix, name, value, without = Vec::new()))]
pub fn check_option_py<'py>(
    job: &str,
    prefix: &str,
    name: &str,
    value: Bound<'py, PyAny>,
    without: Vec<String>,
) -> PyResult<Bound<'py, PyAny>> {
    // A callable (a lookup) is the door's to check: the core sees it as unset.
    let (json, shown) = if value.is_callable() {
        (Value::Null, None)
    } else {
        option_json(&value)?
    };
    check_option(job, prefix, name, &json, shown.as_deref(), &without)
        .map_err(crate::errors::to_py)?;
    Ok(value)
}

/// An option's value as JSON for the core's check, and how to show it when JSON
/// cannot carry it (its `repr`; the core then refuses it as of the wrong kind, naming
/// the option and what it must be).
fn option_json(value: &Bound<'_, PyAny>) -> PyResult<(Value, Option<String>)> {
    match convert::to_json(value) {
        Ok(json) => Ok((json, None)),
        Err(_) => {
            let shown = Some(value.repr()?.to_string());
            match seconds_of(value)?.and_then(serde_json::Number::from_f64) {
                Some(number) => Ok((Value::Number(number), shown)),
                None => Ok((Value::Object(Map::new()), shown)),
            }
        }
    }
}

/// Seconds Python spells other than as an int or a float: a `decimal.Decimal` or a
/// `fractions.Fraction` (as a float), a `datetime.timedelta` (its `total_seconds()`:
/// `timedelta(minutes=10)` is 600, `timedelta(60)` 60 days); None for any other value,
/// and for a Decimal `sNaN` or a Fraction beyond the float range (no float holds them:
/// the core refuses them as of the wrong kind, never float()'s ValueError/OverflowError).
/// The Ruby gem takes Rational, BigDecimal and ActiveSupport's `10.minutes` alike.
fn seconds_of(value: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
    let class = value.get_type();
    let module: String = class.getattr("__module__")?.extract().unwrap_or_default();
    let name: String = class.getattr("__qualname__")?.extract().unwrap_or_default();
    Ok(match (module.as_str(), name.as_str()) {
        ("decimal", "Decimal") | ("fractions", "Fraction") => value.extract::<f64>().ok(),
        ("datetime", "timedelta") => Some(value.call_method0("total_seconds")?.extract()?),
        _ => None,
    })
}
