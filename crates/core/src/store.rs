//! The process's handles on one database: [`Store`] (a configuration, and the pool it
//! builds in each process) and [`PoolHandle`] (the pool with this process's repeat
//! bookkeeping and its one lease-renewal timer).
//!
//! **Fork.** A forked child finds a different pid ([`Store::pool`]) and builds its
//! own pool; the parent's runtime, pool and sockets are leaked in the child, never
//! dropped or touched (see [`crate::pool`]).

use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Runtime;
use uuid::Uuid;

use crate::bookkeeping::Bookkeeper;
use crate::config::Config;
use crate::conn::Interrupt;
use crate::error::Result;
use crate::heartbeat::{Heartbeat, Timer};
use crate::pool::Pool;

/// The pool of one process with what the process keeps beside it: the queue of
/// repeated deliveries to record ([`Bookkeeper`]) and the one lease-renewal timer
/// ([`Timer`]). Derefs to its [`Pool`]. Cheap to clone.
#[derive(Clone)]
pub struct PoolHandle {
    pool: Pool,
    bookkeeper: Arc<Bookkeeper>,
    heartbeats: Arc<Timer>,
}

impl PoolHandle {
    /// This process's one lease-renewal timer (see [`crate::heartbeat::Timer`]).
    pub fn heartbeats(&self) -> &Arc<Timer> {
        &self.heartbeats
    }

    /// This process's queue of repeated deliveries to record (see
    /// [`crate::bookkeeping`]).
    pub fn bookkeeper(&self) -> &Arc<Bookkeeper> {
        &self.bookkeeper
    }

    /// Starts renewing the claim `token` on this process's timer: [`Heartbeat::start`].
    pub fn heartbeat(
        &self,
        job_type: String,
        operation_key: String,
        token: Uuid,
        lease_seconds: f64,
        max_run_seconds: f64,
    ) -> Heartbeat {
        Heartbeat::start(
            &self.heartbeats,
            &self.pool,
            job_type,
            operation_key,
            token,
            lease_seconds,
            max_run_seconds,
        )
    }
}

impl Deref for PoolHandle {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        &self.pool
    }
}

struct Owned {
    pid: u32,
    /// Taken when dropped.
    runtime: Option<Runtime>,
    pool: PoolHandle,
}

/// Clones of a pool that are no user of it: its owner's, and the repeat bookkeeping's
/// background writer's ([`Bookkeeper::run`]).
const OWN_CLONES: usize = 2;

impl Owned {
    /// Waits (polling every 20 ms) until no call, connection, transaction or live
    /// heartbeat uses the pool any more, writes its queued repeat bookkeeping (a failure is
    /// dropped with the pool: telemetry only), then closes it (on drop) with no batch
    /// of bookkeeping being written. Blocks: for a thread of its own ([`Owned::close_later`]).
    fn close_when_idle(self) {
        // The heartbeat timer's task, once started, keeps a clone for good: it is no
        // user. Live heartbeats hold no clone, so they are waited for by count: closing
        // the pool under them would stop renewing claims whose bodies still run. So
        // are renewals the task took before their claim stopped (its clone for one is
        // made after it let the schedule go).
        let heartbeats = self.pool.heartbeats().clone();
        while self.pool.users() > OWN_CLONES + heartbeats.tasks() as usize || heartbeats.busy() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let bookkeeper = self.pool.bookkeeper().clone();
        let _ = bookkeeper.settle(&self.pool, &Interrupt::none());
        // The background writer may have taken a batch meanwhile (one settle left
        // queued when it failed): its thread would use the runtime after it stopped.
        // Held until the runtime stopped, so no batch is in flight and none starts.
        let _writing = bookkeeper.hold_writes();
        drop(self);
    }

    /// Closes the pool on a thread of its own once nothing uses it any more
    /// ([`Owned::close_when_idle`]), without blocking the calling thread; when no
    /// thread can be started, at once (calls in flight then fail with a connection
    /// error).
    fn close_later(self) {
        // On failure the closure, and the pool with it, is dropped: closed at once.
        let _ = std::thread::Builder::new()
            .name("idempotent_job-close".into())
            .spawn(move || self.close_when_idle());
    }
}

impl Drop for Owned {
    /// Closes the pool's connections (each idle one now, each in use as it comes back)
    /// and stops its runtime, without ever blocking the dropping thread (a Ruby GC) on
    /// the runtime's threads. Never reached in a forked child: see [`Store::pool`].
    fn drop(&mut self) {
        self.pool.close();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A configured connection to one database. Cheap to create: nothing connects until
/// the first [`Store::pool`].
pub struct Store {
    config: Config,
    owned: Mutex<Option<Owned>>,
}

/// The pool in `owned` if this process built it (not one inherited through fork).
fn of_this_process(owned: &Option<Owned>) -> Option<PoolHandle> {
    owned
        .as_ref()
        .filter(|o| o.pid == std::process::id())
        .map(|o| o.pool.clone())
}

impl Store {
    /// Validates `config` (without connecting) and returns an idle store.
    ///
    /// Errors: [`crate::error::Error::Config`] for an invalid configuration.
    pub fn new(config: Config) -> Result<Self> {
        config.validate()?;
        Ok(Store {
            config,
            owned: Mutex::new(None),
        })
    }

    /// The settings this store was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The pool of the current process, created on first call and re-created (the old
    /// one and its runtime leaked) when the pid changed since.
    ///
    /// Errors: [`crate::error::Error::Config`] if the configuration cannot build a pool,
    /// [`crate::error::Error::Connection`] if the background runtime cannot start.
    pub fn pool(&self) -> Result<PoolHandle> {
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = of_this_process(&owned) {
            return Ok(pool);
        }
        if let Some(stale) = owned.take() {
            // Inherited from the parent process: never drop it here.
            std::mem::forget(stale);
        }
        let built = self.build()?;
        let pool = built.pool.clone();
        pool.background()
            .spawn(Bookkeeper::run(pool.pool.clone(), pool.bookkeeper.clone()));
        *owned = Some(built);
        Ok(pool)
    }

    /// The pool of the current process if it was built already ([`Store::pool`] builds
    /// it), never building one: for work that only concerns a pool in use, such as
    /// writing its queued repeat bookkeeping.
    pub fn built_pool(&self) -> Option<PoolHandle> {
        of_this_process(&self.owned.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn build(&self) -> Result<Owned> {
        let (runtime, pool) = Pool::build(&self.config)?;
        Ok(Owned {
            pid: pool.pid(),
            pool: PoolHandle {
                pool,
                bookkeeper: Default::default(),
                heartbeats: Default::default(),
            },
            runtime: Some(runtime),
        })
    }

    /// Closes this process's pool once nothing uses it any more, without waiting: a
    /// thread of its own waits until every call in flight, checked-out connection,
    /// open transaction and running heartbeat of the pool is done, writes its queued
    /// repeat bookkeeping, then closes its connections and stops its runtime (for a
    /// store replaced by a new configuration, so its connections and threads do not
    /// wait for a garbage collection). A call made on the store afterwards builds a
    /// new pool. Does nothing when no pool was built in this process.
    ///
    /// Errors: none; when no thread can be started, the pool is closed at once
    /// (calls in flight then fail with a connection error).
    pub fn close(&self) {
        let owned = self.owned.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(owned) = owned else { return };
        if owned.pid != std::process::id() {
            std::mem::forget(owned); // inherited through fork: never dropped here
            return;
        }
        owned.close_later();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let owned = self
            .owned
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(owned) = owned else { return };
        if owned.pid != std::process::id() {
            // Garbage-collected in a forked child: the parent's runtime must not be
            // shut down from here (its threads do not exist; shutdown would hang).
            std::mem::forget(owned);
            return;
        }
        // Not at once: the runtime's threads may still work for the pool (a batch of
        // repeat bookkeeping being written, a renewal), and stopping the runtime under
        // them makes their next use of its timer panic. Closed like `Store::close`.
        owned.close_later();
    }
}
