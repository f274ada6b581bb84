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

#![warn(missing_docs)]

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

mod job;
pub use job::{Delivery, Job, JobBuilder, Outcome, PerformError};

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
    /// Errors: [`Error::OperationKey`] for a bad key; [`Error::Config`] for a rerun of a
    /// record with no stored job (held without the takeover that stores it; it stays
    /// held); connection and database errors.
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
    Err(Error::OperationKey(keys::value_refusal(job_type, &problem)))
}

/// Drops `value`, unless it nests deeper than the core's limit: then it is leaked, as
/// serde_json's drop of a value recurses once per level and one built a million deep
/// would overflow the stack (a value refused by the door must not crash the process).
pub(crate) fn refuse_deep(value: Value) {
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
    let refuse = |problem: String| Error::OperationKey(keys::value_refusal(job_type, &problem));
    let given = parts;
    let parts = given
        .iter()
        .map(|p| keys::part(p, &KEY_WORDS))
        .collect::<Result<Vec<_>, _>>();
    let parts = match parts {
        Ok(parts) => parts,
        Err(problem) => {
            // A part nested past the core's limit is refused; dropping it would recurse
            // once per level (see refuse_deep).
            for part in given {
                refuse_deep(part);
            }
            return Err(refuse(problem));
        }
    };
    let text = keys::composite_text(parts);
    for part in given {
        refuse_deep(part);
    }
    match keys::problem(job_type.as_bytes(), text.as_bytes()) {
        None => Ok(text),
        Some(problem) => Err(refuse(problem)),
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
