//! `idempotent_job._native.Store`: one configured database (its pool built lazily and
//! rebuilt in a forked child: configured in Celery's parent, used in each pool child)
//! and the job defaults of `configure`. Internal: the public API is
//! `idempotent_job/__init__.py`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Map, Value};

use crate::convert::{self, KeyText};
use crate::errors::config;
use crate::gil::detached;
use crate::protocol::{self, Delivery, Options, Outcome, Stale};
use idempotent_job_core::claim::{self, Resolution};
use idempotent_job_core::config::Config;
use idempotent_job_core::error::Error;
use idempotent_job_core::migrate;
use idempotent_job_core::retry::with_fresh_conn;
use idempotent_job_core::store::{with_conn, Lane, Store as CoreStore};

/// The job defaults `configure` takes besides the connection settings, with the Ruby
/// gem's defaults (`lib/idempotent_job/configuration.rb`): lease 300 s, on_stale
/// "reclaim", on_mismatch "log", heartbeat on, max_run 3600 s, defer_margin 1 s,
/// retention 30 days.
/// TODO(inputs): read these names and defaults from the core's options module.
pub const JOB_SETTINGS: [&str; 7] = [
    "lease",
    "on_stale",
    "on_mismatch",
    "heartbeat",
    "max_run",
    "defer_margin",
    "retention",
];

/// Options a delivery (a task or a `perform_once` call) may set.
pub const DELIVERY_OPTIONS: [&str; 6] = [
    "lease",
    "on_stale",
    "on_mismatch",
    "heartbeat",
    "max_run",
    "lookup",
];

/// Shortest lease accepted, in seconds (a shorter one cannot be renewed in time).
const MIN_LEASE: f64 = 0.25;

/// The settings `configure` took (see [`JOB_SETTINGS`]).
#[derive(Clone, Debug)]
struct Settings {
    options: Options,
    retention: f64,
}

fn seconds(owner: &str, name: &str, value: &Value, min: f64) -> Result<f64, Error> {
    match value.as_f64() {
        Some(v) if v.is_finite() && v >= min && v <= claim::MAX_LEASE_SECONDS => Ok(v),
        _ => Err(Error::Config(format!(
            "{owner}{name} must be a number of seconds from {min} to {}, got {value}",
            claim::MAX_LEASE_SECONDS
        ))),
    }
}

fn boolean(owner: &str, name: &str, value: &Value) -> Result<bool, Error> {
    value
        .as_bool()
        .ok_or_else(|| Error::Config(format!("{owner}{name} must be True or False, got {value}")))
}

fn text<'a>(owner: &str, name: &str, value: &'a Value) -> Result<&'a str, Error> {
    value
        .as_str()
        .ok_or_else(|| Error::Config(format!("{owner}{name} must be a str, got {value}")))
}

/// Applies one job option (`name` from [`JOB_SETTINGS`]) to `options`; `owner` prefixes
/// messages (e.g. "charge_order: ").
fn apply(owner: &str, options: &mut Options, name: &str, value: &Value) -> Result<(), Error> {
    match name {
        "lease" => options.lease = seconds(owner, name, value, MIN_LEASE)?,
        "on_stale" => {
            options.on_stale =
                Stale::parse(owner.trim_end_matches(": "), text(owner, name, value)?)?
        }
        "on_mismatch" => {
            options.refuse_mismatch = match text(owner, name, value)? {
                "log" => false,
                "raise" => true,
                other => {
                    return Err(Error::Config(format!(
                        "{owner}on_mismatch must be \"log\" or \"raise\", got {other:?}"
                    )))
                }
            }
        }
        "heartbeat" => options.heartbeat = boolean(owner, name, value)?,
        "max_run" => options.max_run = seconds(owner, name, value, MIN_LEASE)?,
        "defer_margin" => options.defer_margin = seconds(owner, name, value, 0.0)?,
        other => {
            return Err(Error::Config(format!("{owner}unknown option {other:?}")));
        }
    }
    Ok(())
}

/// The default URL: `IDEMPOTENT_JOB_DATABASE_URL`, then `DATABASE_URL`.
fn env_url() -> Option<String> {
    ["IDEMPOTENT_JOB_DATABASE_URL", "DATABASE_URL"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// One configured database and the job defaults.
#[pyclass(frozen, module = "idempotent_job._native")]
pub struct Store {
    core: CoreStore,
    settings: Settings,
}

impl Store {
    fn pool(&self) -> PyResult<idempotent_job_core::store::Pool> {
        self.core.pool().map_err(crate::errors::to_py)
    }
}

impl Store {
    /// The defaults overridden by `options` (a dict of [`DELIVERY_OPTIONS`]; None values
    /// are skipped), and the lookup callable if given.
    fn resolve_options<'py>(
        &self,
        job: &str,
        options: &Bound<'py, PyDict>,
    ) -> PyResult<(Options, Option<Bound<'py, PyAny>>)> {
        let owner = format!("{job}: ");
        let mut resolved = self.settings.options.clone();
        let mut lookup = None;
        for (name, value) in options.iter() {
            let name: String = name.extract()?;
            if value.is_none() {
                continue;
            }
            if name == "lookup" {
                if !value.is_callable() {
                    return Err(config(format!(
                        "{owner}lookup must be callable (it gets the operation key and answers \
                         \"done\", \"not_done\" or \"unknown\"), got {}",
                        convert::type_name(&value)
                    )));
                }
                lookup = Some(value);
                continue;
            }
            if !DELIVERY_OPTIONS.contains(&name.as_str()) {
                return Err(config(format!(
                    "{owner}unknown option {name:?} (known: {})",
                    DELIVERY_OPTIONS.join(", ")
                )));
            }
            let json = convert::to_json(&value)
                .map_err(|what| config(format!("{owner}{name}: {what}")))?;
            apply(&owner, &mut resolved, &name, &json).map_err(crate::errors::to_py)?;
        }
        Ok((resolved, lookup))
    }
}

#[pymethods]
impl Store {
    /// `Store(settings_json)`: a JSON object of `configure`'s keyword arguments: the job
    /// defaults ([`JOB_SETTINGS`]) and the connection settings of the core's `Config`
    /// (database_url, pool_size, connect_timeout, checkout_timeout, deadline,
    /// statement_timeout, application_name, schema, host, port, dbname, user, password,
    /// sslmode, sslrootcert, sslcert, sslkey, prepared_statements,
    /// asynchronous_completion). Validates everything; connects lazily.
    ///
    /// Raises `ConfigurationError` naming an unknown setting or a bad value.
    #[new]
    fn new(settings_json: &str) -> PyResult<Self> {
        let parsed: Map<String, Value> =
            serde_json::from_str(settings_json).map_err(|e| config(format!("configure: {e}")))?;
        let mut options = Options {
            lease: 300.0,
            on_stale: Stale::Reclaim,
            refuse_mismatch: false,
            heartbeat: true,
            max_run: 3600.0,
            defer_margin: 1.0,
        };
        let mut retention = 2_592_000.0;
        let mut native = Map::new();
        for (name, value) in parsed {
            if value.is_null() {
                continue;
            }
            if name == "retention" {
                retention = seconds("", "retention", &value, 0.0).map_err(crate::errors::to_py)?;
            } else if JOB_SETTINGS.contains(&name.as_str()) {
                apply("", &mut options, &name, &value).map_err(crate::errors::to_py)?;
            } else {
                native.insert(name, value);
            }
        }
        if !native.contains_key("database_url") {
            if let Some(url) = env_url() {
                native.insert("database_url".into(), Value::String(url));
            }
        }
        let core = Config::from_json(&Value::Object(native).to_string())
            .and_then(CoreStore::new)
            .map_err(crate::errors::to_py)?;
        Ok(Store {
            core,
            settings: Settings { options, retention },
        })
    }

    /// The job defaults as a dict (lease, on_stale, on_mismatch, heartbeat, max_run,
    /// defer_margin, retention).
    fn defaults<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = &self.settings.options;
        let d = PyDict::new(py);
        d.set_item("lease", o.lease)?;
        d.set_item(
            "on_stale",
            match o.on_stale {
                Stale::Reclaim => "reclaim",
                Stale::Hold => "hold",
                Stale::Skip => "skip",
            },
        )?;
        d.set_item(
            "on_mismatch",
            if o.refuse_mismatch { "raise" } else { "log" },
        )?;
        d.set_item("heartbeat", o.heartbeat)?;
        d.set_item("max_run", o.max_run)?;
        d.set_item("defer_margin", o.defer_margin)?;
        d.set_item("retention", self.settings.retention)?;
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
        limit: i64,
    ) -> PyResult<Vec<(String, String)>> {
        let pool = self.pool()?;
        detached(py, move |i| {
            with_fresh_conn(&pool, i, Lane::Main, async |c| {
                claim::held(c, job_type.as_deref(), limit).await
            })
        })
    }

    /// `resolve(job_type, operation_key, as_)`: `as_` is "done" (the effect happened:
    /// completed) or "rerun" (released for the next delivery). Returns False when the
    /// operation is not held or given up. Sent once (never repeated).
    fn resolve(
        &self,
        py: Python<'_>,
        job_type: String,
        operation_key: String,
        as_: &str,
    ) -> PyResult<bool> {
        let resolution = match as_ {
            "done" => Resolution::Done,
            "rerun" => Resolution::Rerun,
            other => {
                return Err(config(format!(
                    "resolve as_ must be \"done\" or \"rerun\", got {other:?}"
                )))
            }
        };
        let pool = self.pool()?;
        detached(py, move |i| {
            with_conn(&pool, i, async |c| {
                claim::resolve(c, &job_type, &operation_key, resolution).await
            })
        })
    }

    /// `purge(older_than or None, batch)`: deletes finished (completed, given up)
    /// records older than `older_than` seconds (default: the `retention` setting) in
    /// batches of `batch`; returns how many went.
    #[pyo3(signature = (older_than, batch))]
    fn purge(&self, py: Python<'_>, older_than: Option<f64>, batch: i64) -> PyResult<u64> {
        let older_than = older_than.unwrap_or(self.settings.retention);
        let mut total = 0;
        loop {
            let pool = self.pool()?;
            let deleted = detached(py, move |i| {
                with_fresh_conn(&pool, i, Lane::Main, async |c| {
                    claim::purge_batch(c, older_than, batch).await
                })
            })?;
            total += deleted;
            if deleted == 0 {
                return Ok(total);
            }
        }
    }

    /// `find(job_type, operation_key)` → dict of the record's columns (str, int, float
    /// epoch seconds for times, None), or None when never claimed. Writes this
    /// process's queued repeat bookkeeping first.
    fn find<'py>(
        &self,
        py: Python<'py>,
        job_type: String,
        operation_key: String,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let pool = self.pool()?;
        let record = detached(py, move |i| {
            pool.bookkeeper().settle(&pool, i)?;
            with_fresh_conn(&pool, i, Lane::Main, async |c| {
                claim::find(c, &job_type, &operation_key).await
            })
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
        let problem = match text {
            KeyText::Text(t) if t.contains('\0') => {
                "the operation key contains a NUL character, which PostgreSQL text cannot store".to_string()
            }
            KeyText::Text(t) if t.len() + job.len() > claim::MAX_KEY_BYTES => format!(
                "job type and operation key are {} bytes together, more than {}: declare a narrower \
                 key (or hash a long one yourself)",
                t.len() + job.len(),
                claim::MAX_KEY_BYTES
            ),
            KeyText::Text(t) => return Ok(t),
            KeyText::Bad(problem) => problem,
        };
        let class = py
            .import("idempotent_job.errors")?
            .getattr("OperationKeyError")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("job_class", job)?;
        kwargs.set_item("job_type", job)?;
        Err(PyErr::from_value(class.call(
            (format!(
                "{job}: operation key: {problem}; the job was not run and nothing was recorded"
            ),),
            Some(&kwargs),
        )?))
    }

    /// `check_options(job, options)`: raises `ConfigurationError` naming `job` when
    /// `options` (a dict of [`DELIVERY_OPTIONS`]) holds an unknown name or a bad value;
    /// for a task's declaration, checked once when the task class is made.
    fn check_options(&self, job: &str, options: &Bound<'_, PyDict>) -> PyResult<()> {
        self.resolve_options(job, options).map(|_| ())
    }

    /// Runs one delivery (see `protocol::perform`): `options` is a dict of
    /// [`DELIVERY_OPTIONS`] overriding the defaults (unknown names raise
    /// `ConfigurationError` naming `job_type`); `payload` any JSON value (list, dict,
    /// str, int, float, bool, None), digested to detect a payload mismatch.
    #[pyo3(signature = (job_type, operation_key, body, payload, options, id, deferrals=0, job_class=None, queue=None, facts=None))]
    #[allow(clippy::too_many_arguments)]
    fn perform_once(
        &self,
        py: Python<'_>,
        job_type: String,
        operation_key: String,
        body: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
        options: &Bound<'_, PyDict>,
        id: String,
        deferrals: u32,
        job_class: Option<String>,
        queue: Option<String>,
        facts: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Outcome> {
        if job_type.is_empty() {
            return Err(config("perform_once: the job type must not be empty"));
        }
        let owner = format!("{job_type}: ");
        let (resolved, lookup) = self.resolve_options(&job_type, options)?;
        let payload = convert::to_json(payload).map_err(|what| {
            config(format!(
                "{owner}the payload holds {what}, which JSON cannot carry"
            ))
        })?;
        let (args_json, args_digest) = convert::json_and_digest(&payload);
        let facts_json = match facts {
            Some(f) => Some(
                convert::to_json(f.as_any())
                    .map_err(|what| config(format!("{owner}facts hold {what}")))?
                    .to_string(),
            ),
            None => None,
        };
        let delivery = Delivery {
            job_class: job_class.unwrap_or_else(|| job_type.clone()),
            job_type,
            operation_key,
            id,
            deferrals,
            queue,
            args_json,
            args_digest,
            facts_json,
        };
        let pool = self.pool()?;
        protocol::perform(
            py,
            &pool,
            &resolved,
            delivery,
            lookup,
            self.core.config().asynchronous_completion,
            body,
        )
    }
}

fn field_value(py: Python<'_>, field: claim::Field<'_>) -> PyResult<Py<PyAny>> {
    use claim::Field;
    let epoch = |t: &chrono::DateTime<chrono::Utc>| t.timestamp_micros() as f64 / 1e6;
    Ok(match field {
        Field::Text(v) | Field::Name(v) => v.into_pyobject(py)?.into_any().unbind(),
        Field::OptText(v) => v.into_pyobject(py)?.into_any().unbind(),
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

/// `describe_url(url)` → the URL described by its parts, never its password.
#[pyfunction]
pub fn describe_url(url: &str) -> String {
    idempotent_job_core::config::describe_url(url)
}
