//! The per-process connection pool ([`Pool`]: checkouts, the reserve lane, the
//! background runtime) and what happens when a connection turns out dead.
//!
//! One background runtime (one worker) runs what must run without a caller: lease
//! heartbeats, the timers of pool checkouts, cancel requests, and opening new
//! connections. A connection given up while it may still run a statement is
//! discarded, never pooled, and its statement is cancelled server-side (see
//! [`Pooled`]'s `Drop`).
//!
//! **Fork.** The pool remembers the process id that built it ([`Pool::pid`]); the
//! owner of a pool builds another in a forked child and leaks the parent's runtime,
//! pool and sockets there, never dropping or touching them, because dropping them
//! there could wait forever (the runtime's threads do not exist after a fork, and a
//! lock may have been held by one of them at fork time).
//!
//! **Retries.** Which calls are sent again on a fresh connection, with what back-off,
//! within which deadline:
//!
//! * A connection found closed when checked out (its backend killed, the server
//!   restarted, a reset) is discarded before anything is sent on it, and a failure to
//!   connect is retried with back-off: for every call, since nothing was sent.
//! * A statement whose connection dies under it (closed, an I/O error, the server
//!   shutting down or refusing connections, or read-only after a failover: [`is_lost`])
//!   is sent again on a fresh connection only through [`with_fresh_conn`], by callers
//!   whose statement is safe to send twice: the claim with the same fencing token (a
//!   claim that had won wins again), every fenced change (each succeeds again for its
//!   own token), reads, purge batches. `resolve`, migrations and transactions never
//!   repeat a statement that may have reached the server.
//! * A statement the server rolled back for a conflict with another transaction (40001
//!   serialization failure, 40P01 deadlock: [`is_conflict`]) is sent again through
//!   [`with_fresh_conn`] the same way, on the same connection (it is healthy), after
//!   the same back-off: what a serializable or optimistic engine (CockroachDB, Aurora
//!   DSQL, YugabyteDB) asks of every client, and harmless on PostgreSQL, where a single
//!   statement of these rarely meets one.
//! * Everything ends within the deadline ([`Config::deadline`]).

mod circuit;
mod pooled;
mod retry;

use circuit::Circuit;
pub use circuit::{
    CIRCUIT_FIRST_OPEN_SECONDS, CIRCUIT_MAX_OPEN_SECONDS, CIRCUIT_MIN_BOUND_SECONDS,
};
use pooled::pool_error;
pub use pooled::Pooled;
pub use retry::{
    backoff, checkout_live, finish_unless_lost, is_conflict, is_lost, with_conn, with_fresh_conn,
    with_fresh_conn_within,
};

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use tokio::runtime::Runtime;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::Config;
use crate::conn::{checkout_deadline_error, drive, Interrupt, PgConn};
use crate::error::{Error, Result};

/// Creates and recycles [`PgConn`]s for deadpool's generic pool.
pub struct Manager {
    pg_config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    connect_timeout: Duration,
    prepared_statements: bool,
    /// Shared by every connection of the process ([`Conn::schema_checked`]).
    schema_checked: Arc<AtomicBool>,
}

impl managed::Manager for Manager {
    type Type = PgConn;
    type Error = Error;

    /// Connects on a blocking thread of the background runtime (a connection's own
    /// runtime cannot be entered from inside the checkout's).
    async fn create(&self) -> Result<PgConn> {
        let (config, tls) = (self.pg_config.clone(), self.tls.clone());
        let (timeout, prepared) = (self.connect_timeout, self.prepared_statements);
        let schema_checked = self.schema_checked.clone();
        tokio::task::spawn_blocking(move || {
            PgConn::connect(&config, tls, timeout, prepared, schema_checked)
        })
        .await
        .map_err(|e| Error::connection(format!("the connecting thread failed: {e}")))?
    }

    /// A connection whose driver ended, or whose client is closed, is dropped.
    async fn recycle(&self, conn: &mut PgConn, _: &Metrics) -> RecycleResult<Error> {
        if conn.is_usable() {
            Ok(())
        } else {
            Err(RecycleError::message("the connection closed"))
        }
    }
}

/// The pool of connections of one process, with the background runtime's handle.
/// Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: managed::Pool<Manager>,
    tls: MakeRustlsConnect,
    background: tokio::runtime::Handle,
    /// The process that built the pool: the only one it ever serves (its owner builds
    /// another in a forked child).
    pid: u32,
    /// Connections kept for [`Lane::Reserve`] ([`RESERVE_SIZE`]).
    reserve: managed::Pool<Manager>,
    /// [`Config::deadline`]: the bound on one call of the gem.
    deadline: Duration,
    /// [`Config::distributed`]: the distributed profile is on.
    distributed: bool,
    /// One per clone of this pool: what its owner waits on before closing it (in-flight
    /// calls, checked-out connections, transactions and heartbeats each hold a clone).
    users: Arc<()>,
    /// The process's circuit breaker over PostgreSQL (see [`Circuit`]).
    circuit: Arc<std::sync::Mutex<Circuit>>,
}

/// Connections kept aside, per process, for [`Lane::Reserve`].
pub const RESERVE_SIZE: usize = 1;

/// Which connections a checkout may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The pool (claims, reads, purges, operators' calls, transactions).
    Main,
    /// The pool or the reserve connection, whichever is free first: for the changes
    /// that end or keep a claim whose body ran or runs (completions, releases,
    /// renewals…), so claims waiting on a row lock elsewhere can never hold every
    /// connection while a finished body waits to record its completion.
    Reserve,
}

impl Pool {
    /// The bound on one call ([`Config::deadline`]).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }
    /// (the call's deadline) as well.
    ///
    /// Errors: as [`Pool::checkout`]; [`checkout_deadline_error`] past `until`.
    pub fn checkout_in(
        &self,
        interrupt: &Interrupt<'_>,
        lane: Lane,
        until: Instant,
    ) -> Result<Pooled> {
        let got = match lane {
            Lane::Main => drive(
                &self.background,
                interrupt,
                None,
                Some(until),
                self.inner.get(),
            ),
            Lane::Reserve => match self.checkout_at_once(interrupt, until) {
                Some(got) => got,
                None => self.race_reserve(interrupt, until),
            },
        };
        let object = got
            .map_err(|e| self.expired(e, checkout_deadline_error))?
            .map_err(pool_error)?;
        Ok(Pooled {
            object: Some(object),
            pool: self.clone(),
            finished: false,
            spoiled: false,
        })
    }

    /// The reserve lane's first try: a pool connection when one is idle and a permit
    /// free, taken without waiting (deadpool's zero `wait`: a semaphore `try_acquire`).
    /// `None` when the pool would make the call wait, or has no idle connection: the
    /// caller then races the pool against the reserve ([`Pool::race_reserve`]). Most
    /// completions find a free connection, and so spawn no task.
    fn checkout_at_once(
        &self,
        interrupt: &Interrupt<'_>,
        until: Instant,
    ) -> Option<Result<std::result::Result<Object<Manager>, PoolError<Error>>>> {
        if self.inner.status().available == 0 {
            return None;
        }
        let at_once = managed::Timeouts {
            wait: Some(Duration::ZERO),
            ..self.inner.timeouts()
        };
        let got = drive(
            &self.background,
            interrupt,
            None,
            Some(until),
            self.inner.timeout_get(&at_once),
        );
        match got {
            Ok(Err(PoolError::Timeout(managed::TimeoutType::Wait))) => None,
            other => Some(other),
        }
    }

    /// The pool or the reserve, whichever answers first, for [`Lane::Reserve`] when the
    /// pool has no connection free at once.
    fn race_reserve(
        &self,
        interrupt: &Interrupt<'_>,
        until: Instant,
    ) -> Result<std::result::Result<Object<Manager>, PoolError<Error>>> {
        // The reserve's checkout is a task of its own: when the pool answers
        // first, the task still ends, and a reserve connection it was making
        // goes back to the reserve, idle, for the next such call. Raced in place
        // and dropped, a half-made reserve connection was closed every time the
        // pool freed first: under load, a session opened and closed per
        // completion (243 sessions in 2 s of 8 threads' deliveries).
        let reserve = self.reserve.clone();
        let mut reserved = self.background.spawn(async move { reserve.get().await });
        drive(&self.background, interrupt, None, Some(until), async {
            tokio::select! {
                biased;
                object = self.inner.get() => object,
                joined = &mut reserved => joined.unwrap_or(Err(PoolError::Closed)),
            }
        })
    }

    /// Waits `pause` on the calling thread, watching `interrupt` (a retry's back-off).
    ///
    /// Errors: [`Error::Interrupted`].
    pub fn pause(&self, interrupt: &Interrupt<'_>, pause: Duration) -> Result<()> {
        drive(
            &self.background,
            interrupt,
            None,
            None,
            // Made inside the runtime (its timer), not here.
            async move { tokio::time::sleep(pause).await },
        )
    }

    /// Turns a [`drive`] time-out into the error `named` makes for this pool's deadline
    /// ([`checkout_deadline_error`] or [`deadline_error`]); other errors pass unchanged.
    fn expired(&self, err: Error, named: fn(Duration) -> Error) -> Error {
        match err {
            Error::Timeout { message, .. } if message.is_empty() => named(self.deadline),
            other => other,
        }
    }

    /// What a connection of its own (outside the pool: a waiter's LISTEN connection)
    /// is opened with: the pool's connection settings, TLS
    /// connector and connect timeout.
    pub fn dedicated(&self) -> (tokio_postgres::Config, MakeRustlsConnect, Duration) {
        let manager = self.inner.manager();
        (
            manager.pg_config.clone(),
            self.tls.clone(),
            manager.connect_timeout,
        )
    }

    /// Whether the pool's connections keep session state (named prepared statements:
    /// [`Config::prepared_statements`]). False behind PgBouncer in transaction mode,
    /// where a session's LISTEN would not stay with its connection either.
    pub fn session_state(&self) -> bool {
        self.inner.manager().prepared_statements
    }

    /// Whether the distributed profile is on ([`Config::distributed`]): migrations take
    /// a lock row instead of an advisory lock.
    pub fn distributed(&self) -> bool {
        self.distributed
    }

    /// The process this pool (and anything checked out of it) belongs to.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The background runtime: heartbeats, cancel requests, checkout timers.
    pub fn background(&self) -> &tokio::runtime::Handle {
        &self.background
    }

    /// Polls `future` on the background runtime from the calling thread, watching
    /// `interrupt` (for waits on the pool's own locks and semaphores).
    ///
    /// Errors: [`Error::Interrupted`].
    pub fn block_on_background<F: Future>(
        &self,
        interrupt: &Interrupt<'_>,
        future: F,
    ) -> Result<F::Output> {
        drive(&self.background, interrupt, None, None, future)
    }

    /// Checks a connection out, blocking the calling thread: an idle one at once, else
    /// a new one (within `connect_timeout`) while fewer than `pool_size` are open, else
    /// waits at most `checkout_timeout` for one to come back.
    ///
    /// Errors: [`Error::Timeout`] (checkout or connect timeout), [`Error::Connection`],
    /// [`Error::Interrupted`].
    pub fn checkout(&self, interrupt: &Interrupt<'_>) -> Result<Pooled> {
        loop {
            let mut object = drive(&self.background, interrupt, None, None, self.inner.get())?
                .map_err(pool_error)?;
            // An idle connection's I/O is driven by nobody: let it read what the server
            // sent meanwhile (a termination on restart or failover) before it is used.
            if object.refresh() {
                return Ok(Pooled {
                    object: Some(object),
                    pool: self.clone(),
                    finished: false,
                    spoiled: false,
                });
            }
            drop(Object::take(object)); // closed: never back to the pool
        }
    }
}

impl Pool {
    /// Builds the pool of the current process for `config` (nothing connects yet) and
    /// the background runtime it runs on, which the caller owns: dropping the runtime
    /// stops the pool's timers and heartbeats.
    ///
    /// Errors: [`Error::Config`] if the configuration cannot build a pool,
    /// [`Error::Connection`] if the background runtime cannot start.
    pub(crate) fn build(config: &Config) -> Result<(Runtime, Pool)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(config.pool_size.max(1) + RESERVE_SIZE + 2)
            .thread_name("idempotent_job")
            .enable_all()
            .build()
            .map_err(|e| Error::connection(format!("cannot start the tokio runtime: {e}")))?;
        let tls = crate::tls::connector(&config.tls()?)?;
        let schema_checked = Arc::new(AtomicBool::new(false));
        let pool_of = |size: usize| -> Result<managed::Pool<Manager>> {
            let manager = Manager {
                pg_config: config.pg_config()?,
                tls: tls.clone(),
                connect_timeout: config.connect_timeout(),
                prepared_statements: config.named_statements(),
                schema_checked: schema_checked.clone(),
            };
            managed::Pool::builder(manager)
                .max_size(size)
                .runtime(deadpool::Runtime::Tokio1)
                .wait_timeout(Some(config.checkout_timeout()))
                .build()
                .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))
        };
        let inner = pool_of(config.pool_size)?;
        let reserve = pool_of(RESERVE_SIZE)?;
        let pool = Pool {
            inner,
            tls,
            background: runtime.handle().clone(),
            pid: std::process::id(),
            reserve,
            deadline: config.deadline(),
            distributed: config.distributed(),
            users: Arc::new(()),
            circuit: Default::default(),
        };
        Ok((runtime, pool))
    }

    /// Clones of this pool alive now (each call in flight, checked-out connection,
    /// transaction and task holds one).
    pub(crate) fn users(&self) -> usize {
        Arc::strong_count(&self.users)
    }

    /// Closes the pool's connections: each idle one now, each in use as it comes back.
    pub(crate) fn close(&self) {
        self.inner.close();
        self.reserve.close();
    }
}
