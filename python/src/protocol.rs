//! One delivery through the core's driver ([`Protocol::perform`]): this file is its
//! [`Host`] (the body and a declared lookup called with the GIL held, the core's
//! statements run with it released), turns the outcome into a Python object and logs
//! the core's notes. Nothing of the protocol is decided or sequenced here.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::convert;
use crate::gil::detached;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::protocol::{
    Body, ClaimInfo, DeliveryRequest, Direct, DoorWords, Host, Level, LookupAnswer, Notes,
    Outcome as CoreOutcome, Protocol,
};
use idempotent_job_core::store::PoolHandle;

/// One job type's protocol: its options resolved and checked once (per Celery task
/// class, per `perform_once` call), told in its door's words.
#[pyclass(frozen, module = "idempotent_job._native")]
pub struct JobProtocol {
    pub protocol: Protocol,
}

#[pymethods]
impl JobProtocol {
    /// Whether the body's value is stored with the completion (`store_result`).
    #[getter]
    fn store_result(&self) -> bool {
        self.protocol.options().store_result
    }

    /// The lease in seconds.
    #[getter]
    fn lease(&self) -> f64 {
        self.protocol.options().lease_seconds
    }

    /// Seconds after which the heartbeat stops renewing a running claim (`max_run`).
    #[getter]
    fn max_run(&self) -> f64 {
        self.protocol.options().max_run_seconds
    }

    /// Seconds between two renewals of a running claim's lease (the core's heartbeat
    /// interval for this lease): a door that keeps a message hidden while its body runs
    /// (SQS's visibility) extends it on the same beat.
    #[getter]
    fn renewal_interval(&self) -> f64 {
        idempotent_job_core::heartbeat::interval_for(self.protocol.options().lease_seconds)
            .as_secs_f64()
    }
}

/// A door's words: the gem's defaults ("delivery", the plain API's) with the
/// `id_label`, `defer_text` and `crash_text` of `given` (a dict; None: none) where it
/// has them, each the door's own (celery.py's, sqs.py's `WORDS`).
pub fn words(given: Option<&Bound<'_, PyDict>>) -> PyResult<DoorWords> {
    let mut words = DoorWords::default();
    let Some(given) = given else {
        return Ok(words);
    };
    for (name, field) in [
        ("id_label", &mut words.id_label),
        ("defer_text", &mut words.defer_text),
        ("crash_text", &mut words.crash_text),
    ] {
        if let Some(value) = given.get_item(name)? {
            *field = value.extract()?;
        }
    }
    Ok(words)
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
    /// This delivery's id (Celery's task id; a UUID for the plain API by default).
    #[pyo3(get)]
    pub delivery_id: Option<String>,
}

impl Claim {
    fn of(info: &ClaimInfo) -> Claim {
        Claim {
            job_type: info.job_type.clone(),
            operation_key: info.operation_key.clone(),
            token: info.token.to_string(),
            attempt: info.attempt,
            kind: info.kind.as_str(),
            delivery_id: info.delivery_id.clone(),
        }
    }
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
/// "in_progress" (or "refused": the claim is released or stale but this payload
/// differs from the claim's under `on_mismatch="raise"`).
#[pyclass(frozen, module = "idempotent_job._native")]
pub struct Outcome {
    #[pyo3(get)]
    pub decision: &'static str,
    /// The body's return value when it ran; the first run's stored result for a
    /// completed repeat whose result was stored (`replayed`); None otherwise.
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
    /// True when `value` is the first run's stored result (a repeat).
    #[pyo3(get)]
    pub replayed: bool,
    /// True when the delivery waited for a live claim to end (`wait=`) before this
    /// outcome: a completed operation found after the wait is labelled "waited" on the
    /// delivery's span.
    #[pyo3(get)]
    pub waited: bool,
    /// The claim the body ran under, when it ran.
    #[pyo3(get)]
    pub claim: Option<Py<Claim>>,
    /// What became of the result `store_result` asked to keep: "stored", "too_large"
    /// (over `max_result_bytes`) or "unencodable" (not JSON, e.g. a datetime or an
    /// `object()`): then not stored and a repeat replays nothing; None when no store was
    /// requested. For "ran" this run's; for a repeat ("completed") the first run's (the
    /// record's `result_state`). Ruby's `Outcome#result_state`.
    #[pyo3(get)]
    pub result_state: Option<&'static str>,
    /// The outcome's label, as on the delivery's span and Ruby's `Outcome#label`
    /// (the core's `telemetry::outcome_label`): "ran", "reclaimed", "replayed", "waited",
    /// "skipped", "in_progress", "held", "given_up" or "refused".
    #[pyo3(get)]
    pub label: &'static str,
}

#[pymethods]
impl Outcome {
    /// True when the body ran (and its claim completed).
    #[getter]
    fn ran(&self) -> bool {
        self.decision == "ran"
    }

    /// True when the result was stored (`result_state == "stored"`): for "ran" this run's
    /// value, for a repeat the first run's; False when it was too large or not JSON
    /// (`result_state` says which) or no store was requested. Ruby's `result_stored?`.
    #[getter]
    fn result_stored(&self) -> bool {
        self.result_state == Some("stored")
    }

    fn __repr__(&self) -> String {
        format!(
            "Outcome(decision={:?}, retry_after={:?}, replayed={}, result_state={})",
            self.decision,
            self.retry_after,
            if self.replayed { "True" } else { "False" },
            match self.result_state {
                Some(state) => format!("{state:?}"),
                None => "None".into(),
            }
        )
    }
}

/// `span_name(job_type)` → the name of a delivery's OpenTelemetry span
/// (`telemetry::span_name`: `"idempotency <job type>"`).
#[pyfunction]
pub fn span_name(job_type: &str) -> String {
    idempotent_job_core::telemetry::span_name(job_type)
}

/// `span_attributes(door, job_type, operation_key, outcome)` → the attributes dict of a
/// delivery's OpenTelemetry span: the core's tracing vocabulary
/// (`telemetry::span_attributes`); the key only as its hash.
#[pyfunction]
pub fn span_attributes<'py>(
    py: Python<'py>,
    door: &str,
    job_type: &str,
    operation_key: &str,
    outcome: &Outcome,
) -> PyResult<Bound<'py, PyDict>> {
    use idempotent_job_core::telemetry::{self, AttrValue, Delivered};
    let claim = outcome.claim.as_ref().map(|c| c.get());
    let attributes = telemetry::span_attributes(&Delivered {
        door,
        job_type,
        operation_key,
        decision: outcome.decision,
        replayed: outcome.replayed,
        waited: outcome.waited,
        claim_kind: claim.map(|c| c.kind),
        attempt: claim.map(|c| c.attempt),
        duplicates: outcome.duplicates,
        result_state: outcome.result_state,
    });
    let out = PyDict::new(py);
    for (name, value) in attributes {
        match value {
            AttrValue::Text(v) => out.set_item(name, v)?,
            AttrValue::Int(v) => out.set_item(name, v)?,
            AttrValue::Bool(v) => out.set_item(name, v)?,
        }
    }
    Ok(out)
}

impl Outcome {
    fn of(py: Python<'_>, o: CoreOutcome, value: Option<Py<PyAny>>) -> PyResult<Outcome> {
        // `replayed` is the core's rule (a repeat answered with the stored result).
        let replayed = value.is_none() && o.replayed();
        let label = o.label();
        let value = match (value, &o.result_json) {
            (Some(v), _) => v,
            (None, Some(json)) => py
                .import("json")?
                .call_method1("loads", (json.as_str(),))?
                .unbind(),
            (None, None) => py.None(),
        };
        Ok(Outcome {
            decision: o.decision.as_str(),
            value,
            retry_after: o.retry_after,
            lease_remaining: o.lease_remaining,
            holder: o.holder,
            duplicates: o.duplicates,
            replayed,
            waited: o.waited,
            claim: o
                .claim
                .as_ref()
                .map(|c| Py::new(py, Claim::of(c)))
                .transpose()?,
            result_state: o.result_state.map(|s| s.as_str()),
            label,
        })
    }
}

/// Logs the core's notes on the `idempotent_job` logger, at their levels.
fn publish(
    py: Python<'_>,
    protocol: &Protocol,
    delivery: &DeliveryRequest,
    notes: Notes,
) -> PyResult<()> {
    if notes.is_empty() {
        return Ok(());
    }
    let logger = py
        .import("logging")?
        .call_method1("getLogger", ("idempotent_job",))?;
    for note in notes {
        let Some(level) = note.level() else { continue };
        let method = match level {
            Level::Info => "info",
            Level::Warn => "warning",
            Level::Error => "error",
        };
        let enabled = logger
            .call_method1("isEnabledFor", (level_number(level),))?
            .is_truthy()?;
        if !enabled {
            continue;
        }
        if let Some(text) = note.text(delivery, protocol.words()) {
            logger.call_method1(method, (text,))?;
        }
    }
    Ok(())
}

fn level_number(level: Level) -> i32 {
    match level {
        Level::Info => 20,
        Level::Warn => 30,
        Level::Error => 40,
    }
}

/// Whether a body's exception means the worker is going away (its effect may have
/// happened, so the claim is kept until its lease ends): `SystemExit` or
/// `KeyboardInterrupt`. Any other exception (Celery's `SoftTimeLimitExceeded`, `Retry`
/// included) releases the claim.
fn is_crash(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<pyo3::exceptions::PySystemExit>(py)
        || err.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py)
}

fn class_and_message(py: Python<'_>, err: &PyErr) -> (String, String) {
    let class = err
        .get_type(py)
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    (class, err.value(py).to_string())
}

/// The lookup's answer to the core's terms.
fn ask_lookup(py: Python<'_>, lookup: Option<&Bound<'_, PyAny>>, key: &str) -> LookupAnswer {
    let Some(lookup) = lookup else {
        return LookupAnswer::Raised {
            error: "ConfigurationError: no lookup callable was given".into(),
        };
    };
    match lookup.call1((key,)) {
        // The core's one parse: a str naming an answer, anything else invalid (its repr).
        Ok(answer) => LookupAnswer::parse(answer.extract::<String>().ok().as_deref(), || {
            (answer.repr().map(|r| r.to_string())).unwrap_or_else(|_| "?".into())
        }),
        Err(e) => {
            let (class, message) = class_and_message(py, &e);
            LookupAnswer::Raised {
                error: format!("{class}: {message}"),
            }
        }
    }
}

/// Runs one delivery through the core's protocol; see the module's documentation.
///
/// Errors: the core's, mapped by `errors::to_py` (`ConfigurationError`,
/// `PayloadMismatchError`, `LookupError`, `LostClaimError`, connection, database and
/// timeout errors: the body did not run, or its completion could not be written);
/// whatever the body raised, after the claim was released (kept for SystemExit and
/// KeyboardInterrupt).
#[allow(clippy::too_many_arguments)]
pub fn perform(
    py: Python<'_>,
    pool: PoolHandle,
    asynchronous_completion: bool,
    max_result_bytes: usize,
    protocol: &Protocol,
    delivery: DeliveryRequest,
    lookup: Option<&Bound<'_, PyAny>>,
    body: &Bound<'_, PyAny>,
) -> PyResult<Outcome> {
    let mut channel = Direct::new(pool, asynchronous_completion);
    let mut notes = Notes::new();
    let mut host = PyHost {
        py,
        lookup,
        body,
        protocol,
        delivery: &delivery,
        failed: None,
    };
    let result = protocol.perform(
        &mut channel,
        &delivery,
        max_result_bytes,
        &mut host,
        &mut notes,
    );
    publish(py, protocol, &delivery, notes)?;
    if let Some(failed) = host.failed.take() {
        return Err(failed);
    }
    let performed = result?;
    match performed.value {
        Some((value, handle)) => {
            let mut outcome = Outcome::of(py, performed.outcome, Some(value.unbind()))?;
            outcome.claim = Some(handle);
            Ok(outcome)
        }
        None => Outcome::of(py, performed.outcome, None),
    }
}

/// Python's side of a delivery the core drives ([`Protocol::perform`]): the body, the
/// lookup, and the GIL released around the core's statements.
struct PyHost<'a, 'py> {
    py: Python<'py>,
    lookup: Option<&'a Bound<'py, PyAny>>,
    body: &'a Bound<'py, PyAny>,
    protocol: &'a Protocol,
    delivery: &'a DeliveryRequest,
    /// What the logger raised while notes were told before user code or a wait (a
    /// KeyboardInterrupt landing in a handler): raised before a wait, else at the end.
    failed: Option<PyErr>,
}

impl<'py> Host for PyHost<'_, 'py> {
    /// The body's value and the claim handle it was given.
    type Value = (Bound<'py, PyAny>, Py<Claim>);
    type Raised = PyErr;

    fn blocking<T: Send>(
        &mut self,
        call: impl FnOnce(&Interrupt<'_>) -> idempotent_job_core::error::Result<T> + Send,
    ) -> PyResult<T> {
        detached(self.py, call)
    }

    fn lookup(&mut self, operation_key: &str) -> LookupAnswer {
        ask_lookup(self.py, self.lookup, operation_key)
    }

    /// Logs what happened so far before user code runs or a wait begins (a waiter's
    /// "waiting up to" line comes before its wait, a takeover's before its body), as the
    /// Ruby binding does.
    fn tell(&mut self, notes: &mut Notes) {
        let told = std::mem::take(notes);
        if let Err(err) = publish(self.py, self.protocol, self.delivery, told) {
            self.failed.get_or_insert(err);
        }
    }

    fn interrupted(&mut self) -> Option<PyErr> {
        self.failed.take()
    }

    fn body(&mut self, claim: &ClaimInfo) -> Body<Self::Value, PyErr> {
        let py = self.py;
        let handle = match Py::new(py, Claim::of(claim)) {
            Ok(handle) => handle,
            Err(err) => return raised(py, err),
        };
        match self.body.call1((handle.clone_ref(py),)) {
            Ok(value) => match unrun(&value) {
                // Not completed: its code has not run. Released like a raising body.
                Some(what) => {
                    let _ = value.call_method0("close");
                    raised(
                        py,
                        crate::errors::config(format!(
                            "{}: the body returned a {what} without running it (an async def or \
                             generator function as the body): its claim was released; pass a \
                             plain function (run a coroutine with asyncio.run inside it)",
                            self.delivery.job_type
                        )),
                    )
                }
                None => Body::Returned((value, handle)),
            },
            Err(err) => raised(py, err),
        }
    }

    // Encoded here, prepared by the core with the configured max_result_bytes (its
    // checks, its result_state and its warning), as the Ruby binding does: a value JSON
    // cannot carry is recorded as unencodable (not stored; the completion stands and a
    // repeat does not run).
    fn encode(&mut self, value: &Self::Value) -> Result<String, String> {
        convert::to_json(&value.0).map(|json| json.to_string())
    }
}

/// What `value` is when it is code a body returned instead of running (a coroutine,
/// generator or async generator object: an `async def` or generator function given as
/// the body), or `None`. Compared with the `types` module's three types (none can be
/// subclassed), read once; the abi3 build has no `PyCoro_Check`.
fn unrun(value: &Bound<'_, PyAny>) -> Option<&'static str> {
    static UNRUN: [(PyOnceLock<Py<PyType>>, &str, &str); 3] = [
        (PyOnceLock::new(), "CoroutineType", "coroutine"),
        (PyOnceLock::new(), "GeneratorType", "generator"),
        (PyOnceLock::new(), "AsyncGeneratorType", "async generator"),
    ];
    let py = value.py();
    let kind = value.get_type();
    UNRUN.iter().find_map(|(cell, name, what)| {
        let unrun = cell.import(py, "types", name).ok()?;
        kind.is(unrun).then_some(*what)
    })
}

/// What the body raised, in the core's terms: released, or kept when the worker is
/// going away ([`is_crash`]).
fn raised<V>(py: Python<'_>, err: PyErr) -> Body<V, PyErr> {
    let (class, message) = class_and_message(py, &err);
    Body::Raised {
        crash: is_crash(py, &err),
        raised: err,
        class,
        message,
    }
}

/// Builds the core's delivery request. A payload or facts JSON cannot carry is refused
/// by the core ([`DeliveryRequest::write_payload`]: a ConfigurationError naming the job),
/// before anything is claimed.
#[allow(clippy::too_many_arguments)]
pub fn request(
    job_type: String,
    operation_key: String,
    id: Option<String>,
    deferrals: u32,
    job_class: Option<String>,
    queue: Option<String>,
    payload: &Bound<'_, PyAny>,
    facts: Option<&Bound<'_, PyDict>>,
) -> PyResult<DeliveryRequest> {
    let mut delivery = DeliveryRequest {
        job_class: Some(job_class.unwrap_or_else(|| job_type.clone())),
        job_type,
        operation_key,
        delivery_id: id,
        queue,
        deferrals,
        ..DeliveryRequest::default()
    };
    let facts = facts.map(|f| convert::to_json(f.as_any()));
    delivery
        .write_payload(convert::to_json(payload), facts)
        .map_err(crate::errors::to_py)?;
    Ok(delivery)
}
