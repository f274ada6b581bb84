//! One delivery of an operation: claim, then run the body (with the GIL), then
//! complete, or release when it raised; a takeover of a stale claim asks the lookup
//! and the stale policy; a live claim answers when to come back.
//!
//! TODO(core): the claim protocol is being moved into the core crate
//! (`crates/core/src/protocol.rs`, issue 21). Until it lands this file binds the core's
//! existing claim, fenced changes and heartbeat, in the same order as the Ruby gem's
//! `lib/idempotent_job/protocol.rb`; once it lands this file only binds that API.

use pyo3::prelude::*;
use uuid::Uuid;

use crate::gil::detached;
use idempotent_job_core::claim::{self, ClaimKind, ClaimRequest, Fenced, Outcome as Decided};
use idempotent_job_core::error::Error;
use idempotent_job_core::heartbeat::Heartbeat;
use idempotent_job_core::retry::with_fresh_conn;
use idempotent_job_core::store::{Lane, Pool};

/// Seconds before a delivery that met a live claim first comes back; doubled per
/// deferral, never later than the holder's lease end plus `defer_margin`.
/// TODO(core): the Ruby gem's `Protocol::Deferral` constants; read them from the core.
const FIRST_DELAY: f64 = 1.0;
const FACTOR: f64 = 2.0;

/// What a delivery does with a stale claim (its lease ran out: the holder may have
/// died before or after its effect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// Run again (a rare duplicate).
    Reclaim,
    /// Do not run; held for a person (`resolve`).
    Hold,
    /// Do not run; given up (a rare miss).
    Skip,
}

impl Stale {
    pub fn parse(job: &str, text: &str) -> Result<Stale, Error> {
        match text {
            "reclaim" => Ok(Stale::Reclaim),
            "hold" => Ok(Stale::Hold),
            "skip" => Ok(Stale::Skip),
            other => Err(Error::Config(format!(
                "{job}: on_stale must be one of \"reclaim\", \"hold\", \"skip\", got {other:?}"
            ))),
        }
    }
}

/// The options of one delivery, each from the call, else the task's declaration,
/// else `configure` (see `store::Settings`).
#[derive(Clone, Debug)]
pub struct Options {
    /// Seconds a claim stays live without a renewal.
    pub lease: f64,
    pub on_stale: Stale,
    /// `on_mismatch="raise"`: refuse a delivery whose payload differs from the claim's.
    pub refuse_mismatch: bool,
    /// Renew the lease in the background while the body runs.
    pub heartbeat: bool,
    /// Seconds after which the heartbeat stops renewing (a hung body loses its claim).
    pub max_run: f64,
    /// Seconds added past the holder's lease end when coming back.
    pub defer_margin: f64,
}

/// What one delivery asks: the record's name, the payload, who delivers it.
pub struct Delivery {
    pub job_type: String,
    pub operation_key: String,
    pub id: String,
    pub deferrals: u32,
    pub job_class: String,
    pub queue: Option<String>,
    pub args_json: String,
    pub args_digest: String,
    pub facts_json: Option<String>,
}

/// The claim a body runs under, passed to it as its one argument.
#[pyclass(frozen, module = "idempotent_job._native")]
pub struct Claim {
    /// The job type (or scope) of the record.
    #[pyo3(get)]
    pub job_type: String,
    /// The operation key: pass it on as the idempotency key of downstream calls.
    #[pyo3(get)]
    pub operation_key: String,
    /// The fencing token (a UUID str) of this claim.
    #[pyo3(get)]
    pub token: String,
    /// Claims made on this record, this one included (1 for the first).
    #[pyo3(get)]
    pub attempt: i32,
    /// "first", "retry" (after a failure or a rerun) or "takeover" (of a stale claim).
    #[pyo3(get)]
    pub kind: &'static str,
}

#[pymethods]
impl Claim {
    fn __repr__(&self) -> String {
        format!(
            "Claim(job_type={:?}, operation_key={:?}, attempt={}, kind={:?})",
            self.job_type, self.operation_key, self.attempt, self.kind
        )
    }
}

/// What a delivery did. `decision` is "ran", "completed", "held", "given_up" or
/// "in_progress".
#[pyclass(frozen, module = "idempotent_job._native")]
pub struct Outcome {
    #[pyo3(get)]
    pub decision: &'static str,
    /// The body's return value when it ran; None otherwise.
    #[pyo3(get)]
    pub value: Py<PyAny>,
    /// Seconds until worth trying again ("in_progress"), else None.
    #[pyo3(get)]
    pub retry_after: Option<f64>,
    /// Seconds left on the holder's lease ("in_progress"), else None.
    #[pyo3(get)]
    pub lease_remaining: Option<f64>,
    /// The delivery id of the live claim's holder ("in_progress").
    #[pyo3(get)]
    pub holder: Option<String>,
    /// Duplicate deliveries counted on the record (for a duplicate), else None.
    #[pyo3(get)]
    pub duplicates: Option<i32>,
    /// True when `value` is the first run's stored result.
    /// TODO(results): stored results (issue 23); until then always False.
    #[pyo3(get)]
    pub replayed: bool,
    /// True when this delivery's payload differed from the claim's (logged).
    #[pyo3(get)]
    pub mismatch: bool,
    /// The claim the body ran under, when it ran.
    #[pyo3(get)]
    pub claim: Option<Py<Claim>>,
}

#[pymethods]
impl Outcome {
    /// True when the body ran (and its claim completed).
    #[getter]
    fn ran(&self) -> bool {
        self.decision == "ran"
    }

    fn __repr__(&self) -> String {
        format!(
            "Outcome(decision={:?}, retry_after={:?}, replayed={})",
            self.decision, self.retry_after, self.replayed
        )
    }
}

fn outcome(py: Python<'_>, decision: &'static str, mismatch: bool) -> Outcome {
    Outcome {
        decision,
        value: py.None(),
        retry_after: None,
        lease_remaining: None,
        holder: None,
        duplicates: None,
        replayed: false,
        mismatch,
        claim: None,
    }
}

/// Seconds until a delivery that met a live claim comes back (see [`FIRST_DELAY`]).
fn deferral_delay(lease_remaining: f64, deferrals: u32, margin: f64) -> f64 {
    let backoff = FIRST_DELAY * FACTOR.powi(deferrals.min(30) as i32);
    backoff.min(lease_remaining.max(0.0) + margin)
}

/// A fenced change of the claim `token`, sent again on a fresh connection when its
/// connection dies (every fenced change is safe to repeat).
fn fence(
    py: Python<'_>,
    pool: &Pool,
    change: Fenced,
    d: &Delivery,
    token: Uuid,
    text: Option<String>,
) -> PyResult<()> {
    let (job_type, key) = (d.job_type.clone(), d.operation_key.clone());
    let pool = pool.clone();
    detached(py, move |interrupt| {
        with_fresh_conn(&pool, interrupt, Lane::Reserve, async |c| {
            claim::fenced(c, change, &job_type, &key, token, text.as_deref()).await
        })
    })
}

/// Runs one delivery; see the module's documentation.
///
/// Errors: the core's (`ConfigurationError` for a bad key or lease; connection and
/// database errors: the body did not run), `PayloadMismatchError` under
/// `on_mismatch="raise"`, `LookupError` from a failing lookup, and whatever the body
/// raised (after the claim was released).
pub fn perform(
    py: Python<'_>,
    pool: &Pool,
    options: &Options,
    delivery: Delivery,
    lookup: Option<Bound<'_, PyAny>>,
    asynchronous_completion: bool,
    body: &Bound<'_, PyAny>,
) -> PyResult<Outcome> {
    let request = ClaimRequest {
        job_type: delivery.job_type.clone(),
        operation_key: delivery.operation_key.clone(),
        jid: Some(delivery.id.clone()),
        lease_seconds: options.lease,
        args_digest: Some(delivery.args_digest.clone()),
        job_class: Some(delivery.job_class.clone()),
        queue: delivery.queue.clone(),
        args_json: Some(delivery.args_json.clone()),
        refuse_mismatch: options.refuse_mismatch,
        facts_json: delivery.facts_json.clone(),
    };
    let decision = {
        let pool = pool.clone();
        detached(py, move |interrupt| {
            claim::deliver(&pool, interrupt, &request)
        })?
    };
    let mismatch = decision.mismatch;
    if mismatch && options.refuse_mismatch {
        return Err(mismatch_error(py, &delivery));
    }
    match decision.outcome {
        Decided::Claimed {
            token,
            attempt,
            kind,
        } => {
            if kind == ClaimKind::Takeover {
                if let Some(verdict) = takeover(py, pool, options, &delivery, token, lookup)? {
                    return Ok(outcome(py, verdict, mismatch));
                }
            }
            let claim = Py::new(
                py,
                Claim {
                    job_type: delivery.job_type.clone(),
                    operation_key: delivery.operation_key.clone(),
                    token: token.to_string(),
                    attempt,
                    kind: kind.as_str(),
                },
            )?;
            let value = run(
                py,
                pool,
                options,
                &delivery,
                token,
                &claim,
                asynchronous_completion,
                body,
            )?;
            let mut done = outcome(py, "ran", mismatch);
            done.value = value;
            done.claim = Some(claim);
            Ok(done)
        }
        Decided::InProgress {
            holder_jid,
            lease_remaining,
            ..
        } => {
            let mut later = outcome(py, "in_progress", mismatch);
            later.retry_after = Some(deferral_delay(
                lease_remaining,
                delivery.deferrals,
                options.defer_margin,
            ));
            later.lease_remaining = Some(lease_remaining);
            later.holder = holder_jid;
            Ok(later)
        }
        Decided::Completed { duplicates } => Ok(duplicate(py, "completed", duplicates, mismatch)),
        Decided::Held { duplicates } => Ok(duplicate(py, "held", duplicates, mismatch)),
        Decided::GivenUp { duplicates } => Ok(duplicate(py, "given_up", duplicates, mismatch)),
        Decided::Refused { .. } => Err(mismatch_error(py, &delivery)),
    }
}

fn duplicate(py: Python<'_>, decision: &'static str, duplicates: i32, mismatch: bool) -> Outcome {
    let mut out = outcome(py, decision, mismatch);
    out.duplicates = Some(duplicates);
    out
}

fn mismatch_error(py: Python<'_>, d: &Delivery) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let class = py
            .import("idempotent_job.errors")?
            .getattr("PayloadMismatchError")?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("job_type", &d.job_type)?;
        kwargs.set_item("operation_key", &d.operation_key)?;
        let message = format!(
            "{} operation {:?}: this delivery's payload differs from the claim's \
             (on_mismatch=\"raise\"); the body was not run",
            d.job_type, d.operation_key
        );
        Ok(PyErr::from_value(class.call((message,), Some(&kwargs))?))
    };
    build().unwrap_or_else(|e| e)
}

/// A takeover of a stale claim: the lookup first ("done": completed without running;
/// "not_done": run; "unknown" or none: the stale policy). Returns the verdict when the
/// body must not run ("completed", "held", "given_up"), None to run it.
fn takeover(
    py: Python<'_>,
    pool: &Pool,
    options: &Options,
    d: &Delivery,
    token: Uuid,
    lookup: Option<Bound<'_, PyAny>>,
) -> PyResult<Option<&'static str>> {
    if let Some(lookup) = lookup {
        let answer = lookup
            .call1((d.operation_key.as_str(),))
            .and_then(|a| a.extract::<String>());
        match answer.as_deref() {
            Ok("done") => {
                fence(py, pool, Fenced::Complete, d, token, None)?;
                return Ok(Some("completed"));
            }
            Ok("not_done") => return Ok(None),
            Ok("unknown") => {}
            other => {
                // Nothing may run blindly: end the lease so the next delivery asks again.
                fence(
                    py,
                    pool,
                    Fenced::Expire,
                    d,
                    token,
                    Some("lookup failed".into()),
                )?;
                let class = py.import("idempotent_job.errors")?.getattr("LookupError")?;
                let problem = match other {
                    Ok(text) => format!("answered {text:?}"),
                    Err(e) => format!("raised {e}"),
                };
                let kwargs = pyo3::types::PyDict::new(py);
                kwargs.set_item("job_type", &d.job_type)?;
                kwargs.set_item("operation_key", &d.operation_key)?;
                let err = PyErr::from_value(class.call(
                    (format!(
                        "{}: the lookup for operation {:?} {problem} (it must answer \"done\", \
                         \"not_done\" or \"unknown\"); the body was not run",
                        d.job_type, d.operation_key
                    ),),
                    Some(&kwargs),
                )?);
                if let Err(cause) = answer {
                    err.set_cause(py, Some(cause));
                }
                return Err(err);
            }
        }
    }
    match options.on_stale {
        Stale::Reclaim => Ok(None),
        Stale::Hold => {
            fence(py, pool, Fenced::Hold, d, token, None)?;
            Ok(Some("held"))
        }
        Stale::Skip => {
            fence(py, pool, Fenced::GiveUp, d, token, None)?;
            Ok(Some("given_up"))
        }
    }
}

/// Runs the body under the claim (a heartbeat renewing its lease when configured),
/// then completes the claim; when the body raises, releases the claim (its error text
/// stored) and raises the body's exception.
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    pool: &Pool,
    options: &Options,
    d: &Delivery,
    token: Uuid,
    claim: &Py<Claim>,
    asynchronous_completion: bool,
    body: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let heartbeat = options.heartbeat.then(|| {
        Heartbeat::start(
            pool,
            d.job_type.clone(),
            d.operation_key.clone(),
            token,
            options.lease,
            options.max_run,
        )
    });
    let result = body.call1((claim.clone_ref(py),));
    if let Some(h) = heartbeat {
        h.stop();
    }
    match result {
        Ok(value) => {
            let change = if asynchronous_completion {
                Fenced::CompleteAsynchronously
            } else {
                Fenced::Complete
            };
            fence(py, pool, change, d, token, None)?;
            Ok(value.unbind())
        }
        Err(err) => {
            let text = format!(
                "{}: {}",
                err.get_type(py)
                    .qualname()
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
                err.value(py)
            );
            // The body's exception wins: a failed release (the lease ran out and another
            // delivery took over) leaves the record to that delivery.
            if let Err(release_error) = fence(py, pool, Fenced::Release, d, token, Some(text)) {
                let message = format!(
                    "{} operation {:?}: the body raised and its claim could not be released: {}",
                    d.job_type,
                    d.operation_key,
                    release_error.value(py)
                );
                py.import("logging")?
                    .call_method1("getLogger", ("idempotent_job",))?
                    .call_method1("warning", (message,))?;
            }
            Err(err)
        }
    }
}
