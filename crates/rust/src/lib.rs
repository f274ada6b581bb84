//! idempotent_job for Rust services: run a job's body at most once per **operation key**,
//! with a durable idempotency record in PostgreSQL — the same table, protocol, option
//! names, outcomes and errors as the Ruby gem and the Python package (a Sidekiq job, a
//! Celery task and a Rust consumer with the same job type and key share one record).
//!
//! ```no_run
//! use idempotent_job_rust::{Config, IdempotentJob, OnStale};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let jobs = IdempotentJob::configure(Config::new("postgres://app@db/app"))?;
//! jobs.migrate().await?;
//! let charge = jobs.job("ChargeOrder").lease(60.0).on_stale(OnStale::Hold).store_result(true).build()?;
//! let outcome = charge
//!     .perform_once(42, |claim| async move {
//!         Ok::<_, std::io::Error>(format!("charged {}", claim.operation_key))
//!     })
//!     .await?;
//! assert!(outcome.ran() || outcome.decision.as_str() == "completed");
//! # Ok(()) }
//! ```
//!
//! The core is blocking (its own small runtime and pool): each step of a delivery runs
//! with [`tokio::task::block_in_place`] on a multi-threaded runtime (on
//! [`tokio::task::spawn_blocking`] on a current-thread one), the body and the lookup on
//! the caller's task. See docs/rust.md.

use std::future::Future;
use std::sync::{Arc, RwLock};

use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::protocol::{
    DeliveryRequest, Direct, DoorWords, JobOptions, Level, Notes, Outcome as CoreOutcome, Protocol,
    Step,
};
use idempotent_job_core::store::Store;
use idempotent_job_core::{keys, operations};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use idempotent_job_core::config::Config;
pub use idempotent_job_core::error::Error;
pub use idempotent_job_core::protocol::{
    unreachable_delay, ClaimInfo as Claim, Decision, LookupAnswer, OnMismatch, OnStale,
};
pub use idempotent_job_core::record::ClaimKind;
pub use idempotent_job_core::records::Resolution;

/// How the key rules name Rust's values in their messages.
const KEY_WORDS: keys::Words = keys::Words {
    nil: "null",
    true_type: "bool",
    false_type: "bool",
    float: "f64",
    string: "String",
    list: "array",
    map: "object",
    accepted: "a string, an integer, or a non-empty JSON array/object",
    instead_of_float: "pass an integer or a string",
};

/// One configured database (a pool per process, built on first use). Cheap to clone
/// (clones share the database and the rerun senders).
#[derive(Clone)]
pub struct IdempotentJob {
    store: Arc<Store>,
    senders: Arc<RwLock<Vec<Sender>>>,
}

/// A rerun sender registered with [`IdempotentJob::on_rerun`].
type Sender = Arc<dyn Fn(&Rerun) -> bool + Send + Sync>;

/// The stored delivery of an operation resolved with [`Resolution::Rerun`]: what its last
/// claim stored, for a sender ([`IdempotentJob::on_rerun`]) to send through its queue
/// again. The same fields as Python's `idempotent_job.Rerun`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rerun {
    /// The job type (idempotency scope).
    pub job_type: String,
    /// The operation key's text as stored.
    pub operation_key: String,
    /// The last claiming delivery's job class, if it gave one.
    pub job_class: Option<String>,
    /// Its queue (an SQS queue URL, a Sidekiq queue, a Celery routing key), if any.
    pub queue: Option<String>,
    /// Its payload ([`Delivery::payload`]), if stored.
    pub args: Option<Value>,
    /// The first claim's facts ([`Delivery::facts`]), if any.
    pub first_facts: Option<Value>,
}

impl IdempotentJob {
    /// A handle on the database `config` names (see [`Config`]: `database_url`,
    /// `pool_size`, `deadline`, … — the Ruby gem's settings). Connects lazily.
    ///
    /// Errors: [`Error::Config`] for an invalid configuration.
    pub fn configure(config: Config) -> Result<Self, Error> {
        Ok(IdempotentJob {
            store: Arc::new(Store::new(config)?),
            senders: Arc::default(),
        })
    }

    /// The held operations (a stale claim under [`OnStale::Hold`], or a spent
    /// `max_takeovers` budget), oldest first, as `(job_type, operation_key)`; only
    /// `job_type`'s when given; at most `limit`. Read-only.
    ///
    /// Errors: connection and timeout errors.
    pub async fn held(
        &self,
        job_type: Option<&str>,
        limit: i64,
    ) -> Result<Vec<(String, String)>, Error> {
        let store = self.store.clone();
        let job_type = job_type.map(str::to_owned);
        blocking(move || {
            let pool = store.pool()?;
            operations::held(&pool, &Interrupt::none(), job_type.as_deref(), limit)
        })
        .await
    }

    /// Registers `sender`, asked by [`IdempotentJob::resolve`] with
    /// [`Resolution::Rerun`] to send the released operation's stored delivery (a
    /// [`Rerun`]) through its queue again; it returns true when it sent it (or queued it:
    /// an async client is driven from a task the sender spawns or a channel it feeds),
    /// false when the record is not its kind. Senders are asked latest first; the first
    /// that sends wins. Python's `idempotent_job.on_rerun`.
    pub fn on_rerun(&self, sender: impl Fn(&Rerun) -> bool + Send + Sync + 'static) {
        self.senders
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(sender));
    }

    /// Settles a held or given-up operation: [`Resolution::Done`] marks it completed (the
    /// effect is known to have happened); [`Resolution::Rerun`] releases it and hands its
    /// stored delivery to the senders registered with [`IdempotentJob::on_rerun`], latest
    /// first, until one sends it; that delivery claims the operation as a retry and runs
    /// once. When no sender takes it a WARN line (target `idempotent_job`) says it was only
    /// released (its next delivery runs it). `key` as given to [`Job::perform_once`].
    /// Returns false when the operation is not held or given up. One statement, sent once.
    ///
    /// Errors: [`Error::OperationKey`] for a bad key; connection and database errors.
    pub async fn resolve(
        &self,
        job_type: &str,
        key: impl Into<Value>,
        how: Resolution,
    ) -> Result<bool, Error> {
        let key = operation_key(job_type, key)?;
        let store = self.store.clone();
        let (job, k) = (job_type.to_owned(), key.clone());
        let stored = blocking(move || {
            let pool = store.pool()?;
            operations::resolve_stored(&pool, &Interrupt::none(), &job, &k, how)
        })
        .await?;
        let Some(stored) = stored else {
            return Ok(false);
        };
        if how == Resolution::Rerun {
            let json = |text: Option<String>| text.and_then(|t| serde_json::from_str(&t).ok());
            let rerun = Rerun {
                job_type: stored.job_type,
                operation_key: stored.operation_key,
                job_class: stored.job_class,
                queue: stored.queue,
                args: json(stored.args_json),
                first_facts: json(stored.first_facts_json),
            };
            let senders: Vec<Sender> = self
                .senders
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let name = format!("{} operation {:?}", rerun.job_type, rerun.operation_key);
            if senders.iter().rev().any(|send| send(&rerun)) {
                log::warn!(target: "idempotent_job", "idempotent_job: {name} resolved for a rerun: re-sent");
            } else {
                log::warn!(
                    target: "idempotent_job",
                    "idempotent_job: {name} resolved for a rerun: released only; no sender registered \
                     with on_rerun re-sends it, so its next delivery runs it"
                );
            }
        }
        Ok(true)
    }

    /// Applies the pending migrations (the same as `rake idempotent_job:migrate` and
    /// Python's `migrate()`); returns the names applied now.
    ///
    /// Errors: [`Error::Migration`], connection and timeout errors.
    pub async fn migrate(&self) -> Result<Vec<String>, Error> {
        let store = self.store.clone();
        blocking(move || {
            let pool = store.pool()?;
            idempotent_job_core::migrate::migrate(&pool, &Interrupt::none())
        })
        .await
    }

    /// A builder for the job type `job_type` (the record's scope; a Sidekiq job or a
    /// Celery task with the same scope shares its records).
    pub fn job(&self, job_type: impl Into<String>) -> JobBuilder {
        JobBuilder {
            store: self.store.clone(),
            job_type: job_type.into(),
            options: JobOptions::default(),
            words: DoorWords::default(),
        }
    }

    /// Writes the repeat bookkeeping queued in the background (duplicate counts) now;
    /// call before a process exits.
    ///
    /// Errors: connection and database errors (the counts stay queued).
    pub async fn settle(&self) -> Result<(), Error> {
        let store = self.store.clone();
        blocking(move || match store.built_pool() {
            Some(pool) => pool.bookkeeper().settle(&pool, &Interrupt::none()),
            None => Ok(()),
        })
        .await
    }
}

/// The operation key's text for `value` as the record stores it (the Ruby gem's and the
/// Python package's text): a string as it is, an integer in decimal, a non-empty array
/// or object as its canonical JSON.
///
/// Errors: [`Error::OperationKey`] naming `job_type` for null, a bool, a float, an empty
/// value, a value nested deeper than the core's limit, or a key too long.
pub fn operation_key(job_type: &str, value: impl Into<Value>) -> Result<String, Error> {
    let value = value.into();
    let text = keys::value_text(&value, &KEY_WORDS);
    refuse_deep(value);
    let problem = match text {
        Ok(text) => match keys::problem(job_type.as_bytes(), text.as_bytes()) {
            None => return Ok(text),
            Some(problem) => problem,
        },
        Err(problem) => problem,
    };
    Err(Error::OperationKey(format!(
        "{job_type}: operation key: {problem}; the job was not run and nothing was recorded"
    )))
}

/// Drops `value`, unless it nests deeper than the core's limit: then it is leaked, as
/// serde_json's drop of a value recurses once per level and one built a million deep
/// would overflow the stack (a value refused by the door must not crash the process).
fn refuse_deep(value: Value) {
    if idempotent_job_core::canonical::nested_too_deep(&value) {
        std::mem::forget(value);
    }
}

/// A composite operation key's text (a key declared as several parts, as Ruby's
/// `idempotency_key: [:order_id, :carrier]` and Python's list declarations): the
/// canonical JSON list of the parts, integers as their decimal text.
///
/// Errors: [`Error::OperationKey`] naming `job_type` when a part cannot be a key.
pub fn composite_key(job_type: &str, parts: Vec<Value>) -> Result<String, Error> {
    let refuse = |problem: String| {
        Error::OperationKey(format!(
            "{job_type}: operation key: {problem}; the job was not run and nothing was recorded"
        ))
    };
    let parts = parts
        .iter()
        .map(|p| keys::part(p, &KEY_WORDS))
        .collect::<Result<Vec<_>, _>>()
        .map_err(refuse)?;
    let text = keys::composite_text(parts);
    match keys::problem(job_type.as_bytes(), text.as_bytes()) {
        None => Ok(text),
        Some(problem) => Err(refuse(problem)),
    }
}

/// Options of one job type, over the core's defaults (its options table).
pub struct JobBuilder {
    store: Arc<Store>,
    job_type: String,
    options: JobOptions,
    words: DoorWords,
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
    /// Declares a lookup: [`Delivery::lookup`]'s closure is asked after a takeover of a
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
    /// 1 s..=1 year, …).
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
    /// value (then `replayed`), when it stored one that reads back as `T`.
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
    /// Facts about this delivery (a JSON object) for the repeats report.
    pub fn facts(mut self, facts: Value) -> Self {
        self.request.facts_json = Some(facts.to_string());
        self
    }
    /// Waits up to `seconds` for a live claim to end before deciding (a completion then
    /// replays); the body never runs while a live lease holds.
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
            return Err(PerformError::Core(Error::Config(format!(
                "{}: the payload holds {problem}, which JSON cannot carry; the job was not run \
                 and nothing was recorded",
                self.request.job_type
            ))));
        }
        self.request.operation_key = self.key?;
        if self.request.delivery_id.is_none() {
            self.request.delivery_id = Some(uuid::Uuid::new_v4().to_string());
        }
        let (json, digest) = idempotent_job_core::canonical::text_and_digest(&self.payload);
        self.request.args_json = Some(json);
        self.request.args_digest = Some(digest);
        let job = self.job.inner.clone();
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
                    return Ok(replay(outcome, None));
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
                            Ok(replay(completion?.outcome, Some(value)))
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

fn replay<T: DeserializeOwned>(o: CoreOutcome, value: Option<T>) -> Outcome<T> {
    // A replay carries the first run's value: a completion whose result was not stored
    // (too large, unencodable) is a repeat without one, as in Ruby and Python.
    let replayed =
        o.replayed() && o.result_state == Some(idempotent_job_core::record::ResultState::Stored);
    let value = value.or_else(|| {
        o.result_json
            .as_deref()
            .and_then(|json| serde_json::from_str(json).ok())
    });
    Outcome {
        decision: o.decision,
        value,
        replayed,
        retry_after: o.retry_after,
        lease_remaining: o.lease_remaining,
        claim: o.claim,
        duplicates: o.duplicates,
    }
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

/// Runs blocking core work: in place on a multi-threaded runtime
/// ([`tokio::task::block_in_place`]: the worker's other tasks move to another worker, no
/// thread hop), on tokio's blocking pool on a current-thread runtime, or here outside one.
async fn blocking<R: Send + 'static>(
    work: impl FnOnce() -> Result<R, Error> + Send + 'static,
) -> Result<R, Error> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        Ok(handle) => handle
            .spawn_blocking(work)
            .await
            .map_err(|e| Error::Panic(e.to_string()))?,
        Err(_) => work(),
    }
}
