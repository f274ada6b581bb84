//! One job type: its options ([`JobBuilder`]), its deliveries ([`Job::perform_once`],
//! [`Delivery`]) and what they return ([`Outcome`], [`PerformError`]).

use super::*;

/// Options of one job type, over the core's defaults (its options table).
pub struct JobBuilder {
    pub(crate) store: Arc<Store>,
    pub(crate) job_type: String,
    pub(crate) options: JobOptions,
    pub(crate) words: DoorWords,
}

impl JobBuilder {
    /// Seconds a claim stays live without a renewal (default 300).
    pub fn lease(mut self, seconds: f64) -> Self {
        self.options.lease_seconds = seconds;
        self
    }
    /// What a delivery does with a stale claim (default [`OnStale::Reclaim`]).
    pub fn on_stale(mut self, policy: OnStale) -> Self {
        self.options.on_stale = policy;
        self
    }
    /// What a delivery with a different payload does (default [`OnMismatch::Log`]).
    pub fn on_mismatch(mut self, rule: OnMismatch) -> Self {
        self.options.on_mismatch = rule;
        self
    }
    /// Renew the lease while the body runs (default true).
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.options.heartbeat = on;
        self
    }
    /// Seconds after which the heartbeat stops renewing (default 3600).
    pub fn max_run(mut self, seconds: f64) -> Self {
        self.options.max_run_seconds = seconds;
        self
    }
    /// Store the body's value (JSON) with the completion, replayed to repeats (default
    /// false).
    pub fn store_result(mut self, on: bool) -> Self {
        self.options.store_result = on;
        self
    }
    /// The reclaim budget (default none): after `takeovers` stale takeovers of one
    /// operation, the next stale claim asks the lookup (if declared) and, unless it
    /// answers, holds the operation for a person whatever [`JobBuilder::on_stale`] says
    /// (`last_error` says why), so a body that kills its process every time stops
    /// looping.
    pub fn max_takeovers(mut self, takeovers: u32) -> Self {
        // Above i32::MAX: refused by the core's check in build() as out of range.
        self.options.max_takeovers = Some(i32::try_from(takeovers).unwrap_or(-1));
        self
    }
    /// Declares a lookup: [`Delivery::run_looking_up`]'s closure is asked after a takeover of a
    /// stale claim (`label` names it in log lines).
    pub fn lookup(mut self, label: impl Into<String>) -> Self {
        self.options.lookup = Some(label.into());
        self
    }
    /// How log lines name a delivery's id (`"message"` for an SQS door; default
    /// `"delivery"`).
    pub fn id_label(mut self, label: impl Into<String>) -> Self {
        self.words.id_label = label.into();
        self
    }

    /// The job, its options checked.
    ///
    /// Errors: [`Error::Config`] naming the job type and the option (a lease outside
    /// [`idempotent_job_core::options::MIN_LEASE_SECONDS`]..=[`idempotent_job_core::options::MAX_SECONDS`],
    /// …; the core's [`idempotent_job_core::options::JOB_OPTIONS`] table owns every limit).
    pub fn build(self) -> Result<Job, Error> {
        if self.job_type.is_empty() {
            return Err(Error::Config("the job type must not be empty".into()));
        }
        let protocol = Protocol::new(&self.job_type, self.options, self.words)?;
        Ok(Job {
            inner: Arc::new(JobInner {
                store: self.store,
                job_type: self.job_type,
                protocol,
            }),
        })
    }
}

struct JobInner {
    store: Arc<Store>,
    job_type: String,
    protocol: Protocol,
}

/// A job type with its options: deliveries of its operations. Cheap to clone.
#[derive(Clone)]
pub struct Job {
    inner: Arc<JobInner>,
}

/// What a delivery ended with; the names of the Ruby and Python outcomes.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<T> {
    /// `Ran`, `Completed`, `Held`, `GivenUp`, `InProgress` or `Refused`
    /// (`decision.as_str()`: `"ran"`, `"completed"`, …).
    pub decision: Decision,
    /// The body's value when it ran; for a completed repeat the first run's stored
    /// value (then `replayed`). A stored value that does not read back as `T` is
    /// `PerformError::Core` (`Error::Unreadable`, naming the record), not an outcome.
    pub value: Option<T>,
    /// `value` is the first run's stored result.
    pub replayed: bool,
    /// For `InProgress`: seconds until worth trying again.
    pub retry_after: Option<f64>,
    /// For `InProgress`: seconds until the holder's lease ends.
    pub lease_remaining: Option<f64>,
    /// The claim this delivery held (ran, or a takeover that did not run).
    pub claim: Option<Claim>,
    /// For a repeat: the record's duplicate count, this one included.
    pub duplicates: Option<i32>,
}

impl<T> Outcome<T> {
    /// The body ran (and returned).
    pub fn ran(&self) -> bool {
        self.decision == Decision::Ran
    }
}

/// What [`Job::perform_once`] can fail with.
#[derive(Debug)]
pub enum PerformError<E> {
    /// The core's error ([`Error::class_name`]: `ConnectionError`, `TimeoutError`,
    /// `LostClaimError`, `PayloadMismatchError`, …). `retryable()` ones before the body
    /// ran mean it did not run.
    Core(Error),
    /// The body's own error: the claim was released first, so the next delivery runs it
    /// again.
    Body(E),
}

impl<E: std::fmt::Display> std::fmt::Display for PerformError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerformError::Core(e) => write!(f, "{}: {e}", e.class_name()),
            PerformError::Body(e) => write!(f, "{e}"),
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for PerformError<E> {}

impl<E> From<Error> for PerformError<E> {
    fn from(e: Error) -> Self {
        PerformError::Core(e)
    }
}

/// One delivery of an operation, with what the queue knows about it.
pub struct Delivery {
    job: Job,
    request: DeliveryRequest,
    key: Result<String, Error>,
    payload: Value,
    /// Why the facts cannot be written (nested past the core's limit, a number no
    /// language reads alike): refused at [`Delivery::run`], before anything is claimed.
    facts_problem: Option<String>,
}

impl Job {
    /// The job type.
    pub fn job_type(&self) -> &str {
        &self.inner.job_type
    }

    /// Seconds between two renewals of a running claim's lease (a third of the lease):
    /// a door keeping a message hidden while its body runs extends it on this beat.
    pub fn renewal_interval(&self) -> std::time::Duration {
        idempotent_job_core::heartbeat::interval_for(self.inner.protocol.options().lease_seconds)
    }

    /// The lease, seconds.
    pub fn lease(&self) -> f64 {
        self.inner.protocol.options().lease_seconds
    }

    /// A delivery of the operation `key` (a string, an integer, or a JSON array/object);
    /// set its id, payload, deferrals, facts, then [`Delivery::run`].
    pub fn delivery(&self, key: impl Into<Value>) -> Delivery {
        let key = operation_key(&self.inner.job_type, key);
        Delivery {
            job: self.clone(),
            request: DeliveryRequest {
                job_type: self.inner.job_type.clone(),
                job_class: Some(self.inner.job_type.clone()),
                ..DeliveryRequest::default()
            },
            key,
            payload: Value::Array(vec![]),
            facts_problem: None,
        }
    }

    /// Runs `body(claim)` at most once for the operation `key`: [`Delivery::run`] of a
    /// delivery with no id, payload or facts.
    pub async fn perform_once<T, E, F, Fut>(
        &self,
        key: impl Into<Value>,
        body: F,
    ) -> Result<Outcome<T>, PerformError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.delivery(key).run(body).await
    }
}

type LookupFn<'a> = Box<
    dyn FnOnce(String) -> std::pin::Pin<Box<dyn Future<Output = LookupAnswer> + Send + 'a>>
        + Send
        + 'a,
>;

impl Delivery {
    /// This delivery's id in its queue (an SQS message id…), stored as the record's
    /// last claiming delivery. Default: a fresh UUID.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.request.delivery_id = Some(id.into());
        self
    }
    /// The operation's arguments (any JSON value): a later delivery with a different
    /// payload is a payload mismatch.
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = payload;
        self
    }
    /// How often this delivery already met a live claim (`retry_after`'s back-off).
    pub fn deferrals(mut self, deferrals: u32) -> Self {
        self.request.deferrals = deferrals;
        self
    }
    /// The queue's name, stored on the record.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.request.queue = Some(queue.into());
        self
    }
    /// Facts about this delivery (a JSON object) for the repeats report. Facts that
    /// cannot be written as JSON (nested deeper than the core's limit, a number no
    /// language reads alike) make the run return [`Error::Config`] naming the job
    /// before anything is claimed, as a payload does.
    pub fn facts(mut self, facts: Value) -> Self {
        // Judged without recursion first: serde_json writes (and drops) a value one
        // call per level, so one built a million deep would overflow the stack.
        match idempotent_job_core::canonical::problem(&facts) {
            Some(problem) => {
                self.facts_problem = Some(problem);
                self.request.facts_json = None;
                crate::refuse_deep(facts);
            }
            None => {
                self.facts_problem = None;
                self.request.facts_json = Some(facts.to_string());
            }
        }
        self
    }
    /// Waits up to `seconds` for a live claim to end before deciding (a completion then
    /// replays); the body never runs while a live lease holds. `seconds` must be from 0
    /// to ten years ([`idempotent_job_core::results::check_wait`]): else the run returns
    /// [`Error::Config`] naming the job before anything is claimed.
    pub fn wait(mut self, seconds: f64) -> Self {
        self.request.wait_seconds = Some(seconds);
        self
    }

    /// Runs `body(claim)` at most once for the operation. `body` gets the claim
    /// ([`Claim::operation_key`]: the reference to pass downstream); its `Ok` value is
    /// the outcome's `value` (stored under `store_result`).
    ///
    /// Errors: [`PerformError::Core`] — [`Error::OperationKey`], [`Error::Config`],
    /// [`Error::PayloadMismatch`] (under `on_mismatch` raise), connection, timeout and
    /// database errors before the body (it did not run), [`Error::LostClaim`] after it;
    /// [`PerformError::Body`] — the body's `Err`, after its claim was released. A body
    /// that panics, or a future dropped mid-body, keeps the claim until its lease ends
    /// (a crash: the stale policy decides).
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<Outcome<T>, PerformError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_with_lookup(None, body).await
    }

    /// [`Delivery::run`] with the declared lookup ([`JobBuilder::lookup`]):
    /// `lookup(operation_key)` is asked after a takeover of a stale claim whether the
    /// effect happened.
    pub async fn run_looking_up<T, E, F, Fut, L, LFut>(
        self,
        lookup: L,
        body: F,
    ) -> Result<Outcome<T>, PerformError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        L: FnOnce(String) -> LFut + Send + 'static,
        LFut: Future<Output = LookupAnswer> + Send + 'static,
    {
        self.run_with_lookup(Some(Box::new(move |key| Box::pin(lookup(key)))), body)
            .await
    }

    async fn run_with_lookup<T, E, F, Fut>(
        mut self,
        mut lookup: Option<LookupFn<'static>>,
        body: F,
    ) -> Result<Outcome<T>, PerformError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // A payload built in Rust past the nesting limit, or holding a number no
        // language reads alike, is refused before anything is claimed (judged without
        // recursion; serde_json's own reader never builds one deeper than 128).
        if let Some(problem) = idempotent_job_core::canonical::problem(&self.payload) {
            refuse_deep(std::mem::take(&mut self.payload));
            return Err(PerformError::Core(
                idempotent_job_core::canonical::unwritable(
                    &self.request.job_type,
                    "payload",
                    &problem,
                ),
            ));
        }
        if let Some(problem) = self.facts_problem.take() {
            return Err(PerformError::Core(
                idempotent_job_core::canonical::unwritable(
                    &self.request.job_type,
                    "facts",
                    &problem,
                ),
            ));
        }
        if let Some(wait) = self.request.wait_seconds {
            // The core's one rule for `wait` (0 to ten years), as in every binding.
            idempotent_job_core::results::check_wait(&self.request.job_type, Some(wait), None)?;
        }
        self.request.operation_key = self.key?;
        if self.request.delivery_id.is_none() {
            self.request.delivery_id = Some(uuid::Uuid::new_v4().to_string());
        }
        let (json, digest) = idempotent_job_core::canonical::text_and_digest(&self.payload);
        self.request.args_json = Some(json);
        self.request.args_digest = Some(digest);
        let job = self.job.inner.clone();
        let named = (
            self.request.job_type.clone(),
            self.request.operation_key.clone(),
        );
        let pool = job.store.pool()?;
        let config = job.store.config();
        let (asynchronous, max_bytes) = (config.asynchronous_completion, config.max_result_bytes);
        let mut driver = Driver {
            job: job.clone(),
            channel: Some(Direct::new(pool, asynchronous)),
            request: Arc::new(self.request),
            notes: Notes::new(),
        };
        let mut step = driver.step(|p, c, i, d, n| p.begin(c, i, d, n)).await?;
        loop {
            step = match step {
                Step::AskLookup(claim) => {
                    let key = claim.info().operation_key.clone();
                    let answer = match lookup.take() {
                        Some(lookup) => lookup(key).await,
                        None => LookupAnswer::Raised {
                            error: "LookupError: no lookup closure given (use run_looking_up)"
                                .into(),
                        },
                    };
                    driver
                        .step(move |p, c, i, _, n| p.after_lookup(c, i, claim, answer, n))
                        .await?
                }
                Step::InProgress(outcome) if outcome.wait_seconds.is_some() => {
                    driver.step(|p, c, i, d, n| p.wait(c, i, d, n)).await?
                }
                Step::Skip(outcome) | Step::InProgress(outcome) => {
                    driver.publish();
                    return replay(outcome, None, &named).map_err(PerformError::Core);
                }
                Step::Run(claim) => {
                    let info = claim.info().clone();
                    // A panic or a dropped future drops `claim`: its heartbeat stops and
                    // the record stays claimed until its lease ends (a crash).
                    let result = body(info).await;
                    return match result {
                        Ok(value) => {
                            let json = job.protocol.options().store_result.then(|| {
                                serde_json::to_value(&value)
                                    .map_err(|e| e.to_string())
                                    .and_then(|json| match idempotent_job_core::canonical::problem(
                                        &json,
                                    ) {
                                        Some(problem) => Err(problem),
                                        None => Ok(json),
                                    })
                            });
                            let completion = driver
                                .step(move |p, c, i, _, n| {
                                    let prepared = json.map(|json| {
                                        let text = json.map(|v| v.to_string());
                                        let input = match &text {
                                            Ok(t) => idempotent_job_core::results::ResultInput::Json(t),
                                            Err(e) => idempotent_job_core::results::ResultInput::Unencodable(e),
                                        };
                                        idempotent_job_core::results::prepare(
                                            max_bytes,
                                            &claim.info().job_type,
                                            &claim.info().operation_key,
                                            input,
                                        )
                                    });
                                    p.complete_prepared(c, i, claim, prepared, n)
                                })
                                .await;
                            driver.publish();
                            replay(completion?.outcome, Some(value), &named)
                                .map_err(PerformError::Core)
                        }
                        Err(error) => {
                            let message = error.to_string();
                            let class = short_type_name::<E>();
                            let _ = driver
                                .step(move |p, c, i, _, n| {
                                    p.release(c, i, claim, &class, &message, n);
                                    Ok(())
                                })
                                .await;
                            driver.publish();
                            Err(PerformError::Body(error))
                        }
                    };
                }
            };
        }
    }
}

fn short_type_name<E>() -> String {
    let full = std::any::type_name::<E>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base).to_string()
}

fn replay<T: DeserializeOwned>(
    o: CoreOutcome,
    value: Option<T>,
    (job_type, operation_key): &(String, String),
) -> Result<Outcome<T>, Error> {
    // A replay carries the first run's value: a completion whose result was not stored
    // (too large, unencodable) is a repeat without one (the core's rule, every binding's).
    // A stored result that is no `T` (a changed result type, another language's run) is
    // refused naming the record, as Ruby and Python raise for one they cannot read back,
    // never a replay without its value.
    let replayed = o.replayed();
    let value = match (value, o.result_json.as_deref()) {
        (Some(value), _) => Some(value),
        (None, Some(json)) => Some(serde_json::from_str(json).map_err(|e| {
            Error::Unreadable(format!(
                "the record of {job_type} operation {operation_key:?} cannot be read: its \
                 stored result is no {} ({e}); the operation is completed and was not run again",
                std::any::type_name::<T>()
            ))
        })?),
        (None, None) => None,
    };
    Ok(Outcome {
        decision: o.decision,
        value,
        replayed,
        retry_after: o.retry_after,
        lease_remaining: o.lease_remaining,
        claim: o.claim,
        duplicates: o.duplicates,
    })
}

/// The core's steps of one delivery, each on a blocking thread.
struct Driver {
    job: Arc<JobInner>,
    channel: Option<Direct>,
    request: Arc<DeliveryRequest>,
    notes: Notes,
}

impl Driver {
    async fn step<R, S>(&mut self, step: S) -> Result<R, Error>
    where
        R: Send + 'static,
        S: FnOnce(
                &Protocol,
                &mut Direct,
                &Interrupt<'_>,
                &DeliveryRequest,
                &mut Notes,
            ) -> Result<R, Error>
            + Send
            + 'static,
    {
        let job = self.job.clone();
        let request = self.request.clone();
        let mut channel = self.channel.take().expect("one step at a time");
        let mut notes = std::mem::take(&mut self.notes);
        let (result, channel, notes) = blocking(move || {
            let result = step(
                &job.protocol,
                &mut channel,
                &Interrupt::none(),
                &request,
                &mut notes,
            );
            Ok((result, channel, notes))
        })
        .await?;
        self.channel = Some(channel);
        self.notes = notes;
        if result.is_err() {
            self.publish();
        }
        result
    }

    /// Logs the core's notes on the `idempotent_job` target of the `log` crate.
    fn publish(&mut self) {
        for note in std::mem::take(&mut self.notes) {
            let Some(level) = note.level() else { continue };
            let level = match level {
                Level::Info => log::Level::Info,
                Level::Warn => log::Level::Warn,
                Level::Error => log::Level::Error,
            };
            if log::log_enabled!(target: "idempotent_job", level) {
                if let Some(text) = note.text(&self.request, self.job.protocol.words()) {
                    log::log!(target: "idempotent_job", level, "{text}");
                }
            }
        }
    }
}
