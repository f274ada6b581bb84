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

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use tokio::runtime::Runtime;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::Config;
use crate::conn::{checkout_deadline_error, deadline_error, drive, Conn, Interrupt, PgConn};
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

/// Seconds calls fail fast after a call spent its whole deadline on an unreachable or
/// unanswering PostgreSQL (the circuit opens): doubling with each such call in a row,
/// at most [`CIRCUIT_MAX_OPEN_SECONDS`].
pub const CIRCUIT_FIRST_OPEN_SECONDS: f64 = 1.0;
/// The shortest bound of a call whose failure can open the circuit: one given less (the
/// enqueue check) may just have met a busy server.
pub const CIRCUIT_MIN_BOUND_SECONDS: f64 = 1.0;
/// The longest the circuit stays open before one call tries PostgreSQL again.
pub const CIRCUIT_MAX_OPEN_SECONDS: f64 = 30.0;

/// The circuit breaker of one process's pool: while PostgreSQL is down or frozen,
/// every call would block its caller for the whole deadline (a Celery pool process,
/// a Sidekiq thread, per delivery). After a claim-side call (the main lane) spends its
/// deadline and fails with a connection error or a time-out, the circuit opens: calls
/// fail at once with a retryable [`Error::Connection`] naming the last failure (a
/// door sends the delivery back) for [`CIRCUIT_FIRST_OPEN_SECONDS`], doubling per
/// failure in a row up to [`CIRCUIT_MAX_OPEN_SECONDS`]; then one call tries (the
/// others still fail fast while it runs), and any answer of the server closes it.
/// Completions, releases and renewals (the reserve lane) are never failed fast.
#[derive(Debug, Default)]
struct Circuit {
    open_until: Option<Instant>,
    trips: u32,
    last: String,
    /// When a call (either lane) last had an answer from the server: a call that spent
    /// its deadline with no answer while another was answered meanwhile waited on
    /// something (a row lock), not on a dead or frozen server, and opens nothing.
    answered: Option<Instant>,
}

impl Circuit {
    fn open_for(trips: u32) -> Duration {
        Duration::from_secs_f64(
            (CIRCUIT_FIRST_OPEN_SECONDS * 2f64.powi(trips.saturating_sub(1).min(16) as i32))
                .min(CIRCUIT_MAX_OPEN_SECONDS),
        )
    }
}

/// Whether a call's result came from the server: a success, or an error it sent (with
/// a SQLSTATE).
fn answered<T>(result: &Result<T>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) => e.sqlstate().is_some(),
    }
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

    /// Lets a call through the circuit ([`Circuit`]): Ok when closed, or when its open
    /// time has passed (this call is the one that tries; others keep failing fast for
    /// up to a deadline while it runs).
    ///
    /// Errors: a retryable [`Error::Connection`] while the circuit is open.
    fn admit(&self) -> Result<()> {
        let mut circuit = self.circuit.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match circuit.open_until {
            Some(until) if now < until => Err(Error::connection(format!(
                "PostgreSQL unreachable: {} call(s) in a row spent the whole deadline ({}); \
                 calls fail at once for {:.1} s more, then one tries again (circuit open)",
                circuit.trips,
                circuit.last,
                (until - now).as_secs_f64()
            ))),
            Some(_) => {
                circuit.open_until = Some(now + self.deadline);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Tells the circuit how an admitted call ended (`started`, `until`: its start and
    /// end): an outage (a connection error at its end, or no answer or connection in
    /// time) opens it, anything else closes it. A call bounded to less than
    /// [`CIRCUIT_MIN_BOUND_SECONDS`] changes nothing.
    fn settle<T>(&self, result: &Result<T>, started: Instant, until: Instant) {
        if until.saturating_duration_since(started)
            < Duration::from_secs_f64(CIRCUIT_MIN_BOUND_SECONDS)
        {
            // Too short a bound to tell an outage from a busy server (the enqueue check).
            return;
        }
        let mut circuit = self.circuit.lock().unwrap_or_else(|e| e.into_inner());
        let heard_since = circuit.answered.is_some_and(|at| at >= started);
        let outage = match result {
            // Connecting is retried until the end: an error then is an outage; one
            // sooner is a single connection lost (the next call may well succeed).
            Err(Error::Connection { sqlstate, .. }) => {
                Instant::now() + Duration::from_millis(100) >= until
                    && sqlstate.as_deref().is_none_or(|s| s.starts_with("08"))
            }
            // No answer or no connection in time; not a statement_timeout (the server
            // answered) nor a pool whose connections are all busy (pool_error).
            Err(Error::Timeout {
                sqlstate: None,
                message,
            }) => !message.contains("(checkout_timeout)") && !heard_since,
            Err(Error::Interrupted) => return,
            _ => false,
        };
        if outage {
            circuit.trips += 1;
            circuit.open_until = Some(Instant::now() + Circuit::open_for(circuit.trips));
            if let Err(e) = result {
                circuit.last = e.to_string().chars().take(300).collect();
            }
        } else if circuit.trips > 0 || circuit.open_until.is_some() {
            *circuit = Circuit::default();
        }
        if answered(result) {
            circuit.answered = Some(Instant::now());
        }
    }

    /// Notes a reserve-lane call's end for the circuit (which it never opens or closes):
    /// an answer from the server shows that it is alive ([`Circuit::answered`]).
    fn heard<T>(&self, result: &Result<T>) {
        if answered(result) {
            let mut circuit = self.circuit.lock().unwrap_or_else(|e| e.into_inner());
            circuit.answered = Some(Instant::now());
        }
    }

    /// Checks a connection out of `lane` like [`Pool::checkout`], giving up at `until`
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

fn pool_error(err: PoolError<Error>) -> Error {
    match err {
        PoolError::Backend(e) => e,
        PoolError::Timeout(_) => Error::Timeout {
            message: "timed out waiting for a free pooled PostgreSQL connection \
                      (checkout_timeout); raise pool_size or checkout_timeout"
                .into(),
            sqlstate: None,
        },
        other => Error::connection(format!("connection pool: {other}")),
    }
}

/// A connection checked out of the pool.
///
/// [`Pooled::run`] is the one way a statement reaches PostgreSQL. Call
/// [`Pooled::finish`] once the work has its answer: on drop the connection goes back
/// to the pool. A connection that was not finished, whose call was given up
/// ([`Error::Interrupted`]), or that closed, is discarded instead: detached from the
/// pool, its statement cancelled server-side, its socket closed, so the next caller
/// never queues behind an orphaned query.
pub struct Pooled {
    object: Option<Object<Manager>>,
    pool: Pool,
    finished: bool,
    /// Given up mid-statement, or closed: never back to the pool.
    spoiled: bool,
}

impl Pooled {
    /// Runs `op` with the connection, driving its I/O on the calling thread until `op`
    /// is done (see the module doc), watching `interrupt`.
    ///
    /// Errors: `op`'s own; [`Error::Interrupted`]; a connection error when the
    /// connection closed (the connection is then discarded).
    pub fn run<T>(
        &mut self,
        interrupt: &Interrupt<'_>,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        self.run_until(interrupt, None, op)
    }

    /// [`Pooled::run`], given up at `until` (the call's deadline): the connection is
    /// then discarded (its statement cancelled) and [`deadline_error`] returned.
    ///
    /// Errors: as [`Pooled::run`]; [`deadline_error`].
    pub fn run_until<T>(
        &mut self,
        interrupt: &Interrupt<'_>,
        until: Option<Instant>,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        let object = self.object.as_mut().expect("connection present until drop");
        let PgConn {
            runtime,
            driver,
            conn,
        } = &mut **object;
        let runtime = runtime.0.as_ref().expect("runtime present until drop");
        let result = drive(runtime, interrupt, Some(driver), until, op(conn));
        let expired = matches!(&result, Err(Error::Timeout { message, .. }) if message.is_empty());
        if driver.is_none() || expired || matches!(result, Err(Error::Interrupted)) {
            self.spoiled = true;
        }
        result.map_err(|e| self.pool.expired(e, deadline_error))?
    }

    /// Whether the connection is still open, looked at without sending anything: one
    /// turn of its reactor lets its driver read what arrived while it sat idle in the
    /// pool (the server's goodbye after `pg_terminate_backend`, a restart, a reset). A
    /// closed connection is marked to be discarded.
    pub fn is_alive(&mut self) -> bool {
        let object = self.object.as_mut().expect("connection present until drop");
        let PgConn {
            runtime, driver, ..
        } = &mut **object;
        let runtime = runtime.0.as_ref().expect("runtime present until drop");
        runtime.block_on(async {
            tokio::task::yield_now().await;
            std::future::poll_fn(|cx| {
                if let Some(d) = driver.as_mut() {
                    if d.as_mut().poll(cx).is_ready() {
                        *driver = None;
                    }
                }
                Poll::Ready(())
            })
            .await
        });
        let alive = driver.is_some() && !object.conn.client.is_closed();
        if !alive {
            self.spoiled = true;
        }
        alive
    }

    /// The bound on one call of its pool ([`Config::deadline`]).
    pub fn deadline(&self) -> Duration {
        self.pool.deadline
    }

    /// Discards the connection now (it is lost, or on the wrong server): never back
    /// to the pool.
    pub fn discard(mut self) {
        self.spoiled = true;
    }

    /// Marks the work as answered: on drop the connection returns to the pool
    /// (unless it was given up or closed).
    pub fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(object) = self.object.take() else {
            return;
        };
        if self.pool.pid != std::process::id() {
            // Inherited through fork (a transaction handle garbage-collected in the
            // child): returning it to the parent's pool, or spawning a cancel on the
            // parent's runtime, could wait forever on a lock another thread held at
            // fork time. The socket is shared with the parent: leak it.
            std::mem::forget(object);
            return;
        }
        if self.finished && !self.spoiled {
            return; // `object` drops here and goes back to the pool
        }
        let pg = Object::take(object);
        if pg.driver.is_some() {
            let cancel = pg.conn.client.cancel_token();
            let tls = self.pool.tls.clone();
            let deadline = self.pool.deadline;
            self.pool.background.spawn(async move {
                // On a dead network the cancel request gets no answer either.
                let _ = tokio::time::timeout(deadline, cancel.cancel_query(tls)).await;
            });
        }
        drop(pg); // closes the socket; its runtime shuts down without blocking
    }
}

/// Runs `op` on a connection checked out for this one operation, then returns it to
/// the pool: every statement outside a transaction goes through here.
///
/// Errors: as [`Pool::checkout`] and [`Pooled::run`].
///
/// The whole call ends within the pool's deadline ([`Config::deadline`]). `op` runs
/// once: only what fails before it is sent (a connection that cannot be made, or was
/// found closed) is retried on a fresh connection (see the module doc); for
/// statements safe to send twice, see [`with_fresh_conn`].
pub fn with_conn<T>(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    op: impl AsyncFnOnce(&mut Conn) -> Result<T>,
) -> Result<T> {
    let started = Instant::now();
    let until = interrupt.bound(started + pool.deadline);
    pool.admit()?;
    let result = checkout_live(pool, interrupt, Lane::Main, until).and_then(|mut pooled| {
        let result = pooled.run_until(interrupt, Some(until), op);
        finish_unless_lost(pooled, &result);
        result
    });
    pool.settle(&result, started, until);
    result
}

/// Errors after which a fresh connection may succeed where this one failed: the
/// connection closed or broke, the server was shutting down or refused connections
/// for now, or it is read-only (25006: it became a standby in a failover).
pub fn is_lost(err: &Error) -> bool {
    matches!(err, Error::Connection { .. }) || err.sqlstate() == Some("25006")
}

/// Errors the server answers when it rolled the statement back for a conflict with a
/// concurrent transaction: 40001 serialization failure, 40P01 deadlock. The
/// connection is healthy; a statement safe to send twice may be sent again.
pub fn is_conflict(err: &Error) -> bool {
    matches!(err.sqlstate(), Some("40001" | "40P01"))
}

/// The back-off before retry number `failures` (from 1): 20 ms, doubling, at most 1 s.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_millis(20 << failures.saturating_sub(1).min(6)).min(Duration::from_secs(1))
}

/// Waits the back-off of retry `failures` unless that would pass `until`.
/// Ok(false): no room left for another attempt.
fn pause(pool: &Pool, interrupt: &Interrupt<'_>, until: Instant, failures: u32) -> Result<bool> {
    let wait = backoff(failures);
    if Instant::now() + wait * 2 >= until {
        return Ok(false);
    }
    pool.pause(interrupt, wait)?;
    Ok(true)
}

/// Checks a live connection out of `lane` before `until`: one found closed is
/// discarded (nothing was sent on it); a failure to connect is retried with
/// [`backoff`] while the deadline leaves room.
///
/// Errors: the last connection error when no room is left, also when the deadline
/// ends a connect that was retried after one (the server refusing or closing
/// connections is what the caller needs to know, not that the last attempt was cut
/// short); [`checkout_deadline_error`] past `until` otherwise; [`Error::Timeout`] (checkout
/// timeout); [`Error::Interrupted`].
pub fn checkout_live(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    lane: Lane,
    until: Instant,
) -> Result<Pooled> {
    let mut failures = 0;
    let mut refused: Option<Error> = None;
    let given_up = |refused: Option<Error>| match refused {
        Some(e) => retried_until_deadline(e, pool.deadline()),
        None => checkout_deadline_error(pool.deadline()),
    };
    loop {
        match pool.checkout_in(interrupt, lane, until) {
            Ok(mut pooled) => {
                if pooled.is_alive() {
                    return Ok(pooled);
                }
                pooled.discard();
            }
            Err(e) if !is_lost(&e) => {
                return Err(if Instant::now() >= until && refused.is_some() {
                    given_up(refused)
                } else {
                    e
                });
            }
            Err(e) => {
                failures += 1;
                if !pause(pool, interrupt, until, failures)? {
                    return Err(retried_until_deadline(e, pool.deadline()));
                }
                refused = Some(e);
            }
        }
        if Instant::now() >= until {
            return Err(given_up(refused));
        }
    }
}

/// A connection error met at every attempt until the deadline, saying so.
fn retried_until_deadline(err: Error, deadline: Duration) -> Error {
    match err {
        Error::Connection { message, sqlstate } => Error::Connection {
            message: format!(
                "{message} (connecting was retried until the deadline of {} s)",
                deadline.as_secs_f64()
            ),
            sqlstate,
        },
        other => other,
    }
}

/// After a call: the connection goes back to the pool, unless `result` says it is
/// lost ([`is_lost`]); then it is discarded and true returned. True also after a
/// conflict ([`is_conflict`]), the connection pooled: the caller may send it again.
pub fn finish_unless_lost<T>(mut pooled: Pooled, result: &Result<T>) -> bool {
    match result {
        Err(e) if is_lost(e) => {
            pooled.discard();
            true
        }
        Err(e) if is_conflict(e) => {
            pooled.finish();
            true
        }
        _ => {
            pooled.finish();
            false
        }
    }
}

/// Runs `op` on a connection of `lane` within the pool's deadline and, when the
/// connection dies under it ([`is_lost`]), again on a fresh one after [`backoff`],
/// until the deadline. Only for statements that are safe to send twice (see the
/// module doc).
///
/// Errors: the last error once no room is left; [`checkout_deadline_error`] (no
/// connection in time) or [`deadline_error`] (no answer in time); `op`'s own.
pub fn with_fresh_conn<T>(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    lane: Lane,
    op: impl AsyncFn(&mut Conn) -> Result<T>,
) -> Result<T> {
    with_fresh_conn_within(pool, interrupt, lane, pool.deadline(), op)
}

/// [`with_fresh_conn`] within `budget` instead of the pool's deadline (a lease
/// renewal waits at most one renewal interval).
///
/// Errors: as [`with_fresh_conn`].
pub fn with_fresh_conn_within<T>(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    lane: Lane,
    budget: Duration,
    op: impl AsyncFn(&mut Conn) -> Result<T>,
) -> Result<T> {
    let started = Instant::now();
    let until = interrupt.bound(started + budget);
    if lane == Lane::Reserve {
        let result = fresh_conn_until(pool, interrupt, lane, until, op);
        pool.heard(&result);
        return result;
    }
    pool.admit()?;
    let result = fresh_conn_until(pool, interrupt, lane, until, op);
    pool.settle(&result, started, until);
    result
}

/// [`with_fresh_conn_within`]'s attempts, until `until`.
fn fresh_conn_until<T>(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    lane: Lane,
    until: Instant,
    op: impl AsyncFn(&mut Conn) -> Result<T>,
) -> Result<T> {
    let mut failures = 0;
    loop {
        let mut pooled = checkout_live(pool, interrupt, lane, until)?;
        let result = pooled.run_until(interrupt, Some(until), async |c| op(c).await);
        if !finish_unless_lost(pooled, &result) {
            return result;
        }
        failures += 1;
        // A dead pooled connection is usually one of several (a restart): the next
        // checkout finds the others closed at once, so the back-off stays short.
        if !pause(pool, interrupt, until, failures)? {
            return result;
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
