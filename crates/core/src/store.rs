//! The per-process connection pool, and how a statement's I/O is driven.
//!
//! **The calling thread drives its own statement.** Every pooled connection owns a
//! small current-thread tokio runtime; its socket is registered with that runtime's
//! reactor, and its `tokio_postgres::Connection` future is kept next to the client
//! instead of being spawned. [`Pooled::run`] polls the connection together with the
//! statement's future inside that runtime's `block_on`, on the thread that asked (a
//! Ruby thread with the GVL released): the request is written, and the answer read,
//! by the caller itself. No other thread is woken per statement (the synchronous
//! `postgres` crate works the same way). One background runtime (one worker) remains
//! for what must run without a caller: lease heartbeats, the timers of pool
//! checkouts, cancel requests, and opening new connections.
//!
//! **Interrupts.** Every blocking call takes an [`Interrupt`]: another thread wakes
//! it ([`Interrupt::notifier`]); the blocked call then asks its owner, on its own
//! thread, whether to carry on (the same future is resumed: nothing is sent twice) or
//! to give up ([`Error::Interrupted`]). A connection given up while it may still run
//! a statement is discarded, never pooled, and its statement is cancelled
//! server-side (see [`Pooled`]'s `Drop`).
//!
//! **Fork.** The pool remembers the process id that built it. A forked child finds a
//! different pid ([`Store::pool`]) and builds its own; the parent's runtime, pool and
//! sockets are leaked in the child, never dropped or touched, because dropping them
//! there could wait forever (the runtime's threads do not exist after a fork, and a
//! lock may have been held by one of them at fork time).

use std::cell::RefCell;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use tokio::runtime::Runtime;
use tokio::sync::Notify;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::bookkeeping::Bookkeeper;
use super::config::Config;
use super::error::{Error, Result};

/// How a blocked call learns that its thread is wanted elsewhere, and asks whether to
/// give up.
///
/// Any thread may wake it through [`Interrupt::notifier`] (a Ruby unblocking
/// function: `Thread#raise`, `Timeout`, `Thread#kill`, `Thread#wakeup`, a signal);
/// the call then runs `on_wake` on its own thread. `on_wake` returns true to give up
/// (the call returns [`Error::Interrupted`]), false to carry on with the same future.
pub struct Interrupt<'a> {
    notify: Notify,
    on_wake: Option<&'a dyn Fn() -> bool>,
}

impl Interrupt<'static> {
    /// An interrupt nothing ever wakes (Rust callers, tests, heartbeats).
    pub fn none() -> Self {
        Interrupt {
            notify: Notify::new(),
            on_wake: None,
        }
    }
}

impl<'a> Interrupt<'a> {
    /// An interrupt that asks `on_wake` (on the blocked thread) whether to give up.
    pub fn new(on_wake: &'a dyn Fn() -> bool) -> Self {
        Interrupt {
            notify: Notify::new(),
            on_wake: Some(on_wake),
        }
    }

    /// What another thread calls `notify_one` on to wake the blocked call. A wake-up
    /// before the call blocks is kept (a permit), never lost.
    pub fn notifier(&self) -> &Notify {
        &self.notify
    }

    fn gives_up(&self) -> bool {
        self.on_wake.is_some_and(|f| f())
    }
}

/// A pooled connection's `tokio_postgres::Connection`: the future that does its I/O.
type Driver = Pin<Box<dyn Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send>>;

/// What [`drive`] blocks on: a connection's own current-thread runtime (only
/// `Runtime::block_on` drives its reactor, on the calling thread), or the background
/// runtime's handle (its worker drives timers; used for checkouts).
pub(crate) trait BlockOn {
    fn block_on<F: Future>(&self, future: F) -> F::Output;
}

impl BlockOn for Runtime {
    fn block_on<F: Future>(&self, future: F) -> F::Output {
        Runtime::block_on(self, future)
    }
}

impl BlockOn for tokio::runtime::Handle {
    fn block_on<F: Future>(&self, future: F) -> F::Output {
        tokio::runtime::Handle::block_on(self, future)
    }
}

enum Step<T> {
    Done(T),
    Woken,
    Closed(Option<tokio_postgres::Error>),
    Expired,
}

/// The error of a call that had no connection yet at its deadline
/// ([`Config::deadline`]): every pooled connection stayed in use, or a new one was not
/// established in time. Nothing was sent.
pub fn checkout_deadline_error(deadline: Duration) -> Error {
    Error::Timeout {
        message: format!(
            "no connection to PostgreSQL within the deadline of {} s (deadline): every pooled \
             connection stayed in use or a new one was not established in time; nothing was sent",
            deadline.as_secs_f64()
        ),
        sqlstate: None,
    }
}

/// The error of a call still unanswered at its deadline ([`Config::deadline`]).
pub fn deadline_error(deadline: Duration) -> Error {
    Error::Timeout {
        message: format!(
            "no answer from PostgreSQL within the deadline of {} s (deadline): the server or \
             the network is not responding; the connection was discarded",
            deadline.as_secs_f64()
        ),
        sqlstate: None,
    }
}

/// Polls `future` to completion inside `runtime`'s `block_on` on the calling thread,
/// together with `driver` (a connection's I/O) when given, and watches `interrupt`.
///
/// When `until` passes first, `future` is abandoned (see [`Step::Expired`]).
///
/// Errors: [`Error::Interrupted`] when the interrupt's owner gave up; a connection
/// error when the driver ended (the connection closed) before `future` did;
/// `Error::Timeout` past `until` (the caller names its deadline).
pub(crate) fn drive<F: Future>(
    runtime: &impl BlockOn,
    interrupt: &Interrupt<'_>,
    mut driver: Option<&mut Option<Driver>>,
    until: Option<Instant>,
    future: F,
) -> Result<F::Output> {
    let mut future = std::pin::pin!(future);
    loop {
        let step = runtime.block_on(async {
            let mut notified = std::pin::pin!(interrupt.notify.notified());
            let mut expiry = std::pin::pin!(until.map(|t| tokio::time::sleep_until(t.into())));
            std::future::poll_fn(|cx| {
                if notified.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Step::Woken);
                }
                if let Some(timer) = expiry.as_mut().as_pin_mut() {
                    if timer.poll(cx).is_ready() {
                        return Poll::Ready(Step::Expired);
                    }
                }
                // The statement first: what it queued is written by the driver below
                // in the same pass.
                if let Poll::Ready(value) = future.as_mut().poll(cx) {
                    return Poll::Ready(Step::Done(value));
                }
                if let Some(slot) = driver.as_deref_mut() {
                    if let Some(d) = slot.as_mut() {
                        if let Poll::Ready(ended) = d.as_mut().poll(cx) {
                            *slot = None;
                            // The statement now fails with "connection closed".
                            if let Poll::Ready(value) = future.as_mut().poll(cx) {
                                return Poll::Ready(Step::Done(value));
                            }
                            return Poll::Ready(Step::Closed(ended.err()));
                        }
                    }
                }
                Poll::Pending
            })
            .await
        });
        match step {
            Step::Done(value) => return Ok(value),
            Step::Woken => {
                if interrupt.gives_up() {
                    return Err(Error::Interrupted);
                }
            }
            Step::Closed(Some(err)) => return Err(err.into()),
            Step::Closed(None) => return Err(Error::connection("the connection closed")),
            Step::Expired => {
                return Err(Error::Timeout {
                    message: String::new(),
                    sqlstate: None,
                })
            }
        }
    }
}

/// Lets go of a current-thread runtime without ever blocking (it may be dropped
/// inside another runtime's task, or in a Ruby GC).
struct OwnRuntime(Option<Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// One open connection as the pool keeps it: its runtime, its I/O driver, and the
/// [`Conn`] statements are sent through.
pub struct PgConn {
    runtime: OwnRuntime,
    /// `None` once the connection ended (closed by the server, a broken socket).
    driver: Option<Driver>,
    conn: Conn,
}

impl PgConn {
    /// Opens a connection on a fresh current-thread runtime, on the calling thread,
    /// within `timeout` (TCP connect, TLS, startup and authentication).
    fn connect(
        config: &tokio_postgres::Config,
        tls: MakeRustlsConnect,
        timeout: Duration,
        prepared_statements: bool,
        schema_checked: Arc<AtomicBool>,
    ) -> Result<PgConn> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::connection(format!("cannot start a connection runtime: {e}")))?;
        let connected =
            runtime.block_on(async { tokio::time::timeout(timeout, config.connect(tls)).await });
        let (client, connection) = connected.map_err(|_| Error::Timeout {
            message: "timed out connecting to PostgreSQL (connect_timeout): the server did not \
                      complete the connection start; check that it is reachable and healthy"
                .into(),
            sqlstate: None,
        })??;
        let mut driver: Driver = Box::pin(connection);
        if prepared_statements {
            // The gem's named statements get one generic plan per connection instead of
            // being re-planned (custom plans) at many calls. PostgreSQL 12 and later;
            // elsewhere the setting is unknown and left alone. A transaction resets it
            // for the job's own statements (see `Session::begin`).
            let mut slot = Some(driver);
            let _ = drive(
                &runtime,
                &Interrupt::none(),
                Some(&mut slot),
                None,
                client.batch_execute("SET plan_cache_mode = force_generic_plan"),
            );
            driver = slot.ok_or_else(|| Error::connection("the connection closed"))?;
        }
        Ok(PgConn {
            runtime: OwnRuntime(Some(runtime)),
            driver: Some(driver),
            conn: Conn {
                client,
                statements: RefCell::new(Vec::new()),
                prepared_statements,
                schema_checked,
            },
        })
    }

    /// Lets the connection's runtime look at the socket once, without waiting, and
    /// its driver read whatever arrived while it was idle. Returns whether the
    /// connection is still usable (false once the server closed it).
    fn refresh(&mut self) -> bool {
        let Some(runtime) = self.runtime.0.as_ref() else {
            return false;
        };
        let driver = &mut self.driver;
        runtime.block_on(async {
            // Once to (re)register interest in the socket, then once more after the
            // reactor had a non-blocking look at it.
            for _ in 0..2 {
                let Some(d) = driver.as_mut() else { return };
                let ended = std::future::poll_fn(|cx| Poll::Ready(d.as_mut().poll(cx))).await;
                if ended.is_ready() {
                    *driver = None;
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        self.is_usable()
    }

    fn is_usable(&self) -> bool {
        self.driver.is_some() && !self.conn.client.is_closed()
    }
}

/// Creates and recycles [`PgConn`]s for deadpool's generic pool.
pub struct Manager {
    pg_config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    connect_timeout: Duration,
    prepared_statements: bool,
    /// Shared by every connection of the process ([`super::schema::ensure`]).
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
    bookkeeper: std::sync::Arc<Bookkeeper>,
    /// The process that built the pool: the only one it ever serves ([`Store::pool`]
    /// builds another in a forked child).
    pid: u32,
    /// Connections kept for [`Lane::Reserve`] ([`RESERVE_SIZE`]).
    reserve: managed::Pool<Manager>,
    /// [`Config::deadline`]: the bound on one call of the gem.
    deadline: Duration,
    /// One per clone of this pool: what [`Store::close`] waits on (in-flight calls,
    /// checked-out connections, transactions and heartbeats each hold a clone).
    users: Arc<()>,
    /// The one lease-renewal timer of this pool's process ([`super::heartbeat`]).
    heartbeats: Arc<super::heartbeat::Timer>,
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
            Lane::Reserve => drive(&self.background, interrupt, None, Some(until), async {
                tokio::select! {
                    biased;
                    object = self.inner.get() => object,
                    object = self.reserve.get() => object,
                }
            }),
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

    /// What a connection of its own (outside the pool: a LISTEN connection, see
    /// [`crate::results::wait`]) is opened with: the pool's connection settings, TLS
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

    /// The process this pool (and anything checked out of it) belongs to.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The background runtime: heartbeats, cancel requests, checkout timers.
    pub fn background(&self) -> &tokio::runtime::Handle {
        &self.background
    }

    /// This process's one lease-renewal timer (see [`super::heartbeat::Timer`]).
    pub fn heartbeats(&self) -> &Arc<super::heartbeat::Timer> {
        &self.heartbeats
    }

    /// This process's queue of repeated deliveries to record (see
    /// [`super::bookkeeping`]).
    pub fn bookkeeper(&self) -> &std::sync::Arc<Bookkeeper> {
        &self.bookkeeper
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
/// found closed) is retried on a fresh connection (see [`super::retry`]); for
/// statements safe to send twice, see [`super::retry::with_fresh_conn`].
pub fn with_conn<T>(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    op: impl AsyncFnOnce(&mut Conn) -> Result<T>,
) -> Result<T> {
    let until = Instant::now() + pool.deadline;
    let mut pooled = super::retry::checkout_live(pool, interrupt, Lane::Main, until)?;
    let result = pooled.run_until(interrupt, Some(until), op);
    super::retry::finish_unless_lost(pooled, &result);
    result
}

/// The statement side of a pooled connection, handed to the work of
/// [`Pooled::run`]: the client, and the connection's cache of the gem's own named
/// prepared statements. Derefs to `tokio_postgres::Client`.
pub struct Conn {
    client: Client,
    /// The gem's prepared statements on this connection, by the address of their
    /// constant SQL text (a handful: a linear look at addresses is quicker than
    /// hashing 1 KB of SQL); a text met at another address (a constant inlined
    /// elsewhere) is found by its content once and added under that address too.
    statements: RefCell<Vec<(usize, &'static str, Statement)>>,
    /// See [`Conn::query_own`].
    prepared_statements: bool,
    /// See [`Conn::schema_checked`].
    schema_checked: Arc<AtomicBool>,
}

impl Conn {
    /// Whether the gem's own statements go out as named prepared statements on this
    /// connection ([`Config::prepared_statements`]).
    pub fn prepared_statements(&self) -> bool {
        self.prepared_statements
    }

    /// Runs one of the gem's own statements (a constant SQL text of
    /// [`super::claim`]) with typed parameters and returns its rows, in one round trip.
    ///
    /// With `prepared_statements` on, `sql` is prepared as a named statement the first
    /// time this connection runs it (one extra round trip, once per connection) and
    /// kept in the connection's statement cache; every later call only binds and
    /// executes it, so PostgreSQL does not parse and plan it again. Off, it is sent as
    /// an unnamed statement (Parse/Bind/Execute) every time.
    ///
    /// Errors: as tokio-postgres's, converted to [`Error`]; a named statement the
    /// server no longer knows (SQLSTATE 26000, or 42P05 for a name taken: what
    /// PgBouncer in transaction mode does) is an [`Error::Database`] that names the
    /// `prepared_statements` setting. The connection's statement cache is then
    /// emptied, so its next call prepares afresh; nothing is retried here.
    pub async fn query_own(
        &self,
        sql: &'static str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        if !self.prepared_statements {
            return Ok(self.client.query_typed(sql, params).await?);
        }
        let (types, values) = split(params);
        let statement = self.prepare_own(sql, &types).await?;
        self.client
            .query(&statement, &values)
            .await
            .map_err(|e| self.own_error(sql, e))
    }

    /// Like [`Conn::query_own`], for a statement whose affected row count is the
    /// answer.
    ///
    /// Errors: see [`Conn::query_own`].
    pub async fn execute_own(
        &self,
        sql: &'static str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64> {
        if !self.prepared_statements {
            return Ok(self.client.execute_typed(sql, params).await?);
        }
        let (types, values) = split(params);
        let statement = self.prepare_own(sql, &types).await?;
        self.client
            .execute(&statement, &values)
            .await
            .map_err(|e| self.own_error(sql, e))
    }

    async fn prepare_own(&self, sql: &'static str, types: &[Type]) -> Result<Statement> {
        let key = sql.as_ptr() as usize;
        let known = {
            let statements = self.statements.borrow();
            let by_address = statements.iter().find(|(k, ..)| *k == key);
            match by_address {
                Some((.., statement)) => return Ok(statement.clone()),
                None => statements
                    .iter()
                    .find(|(_, text, _)| *text == sql)
                    .map(|(.., statement)| statement.clone()),
            }
        };
        if let Some(statement) = known {
            self.statements
                .borrow_mut()
                .push((key, sql, statement.clone()));
            return Ok(statement);
        }
        let statement = self
            .client
            .prepare_typed(sql, types)
            .await
            .map_err(|e| self.own_error(sql, e))?;
        self.statements
            .borrow_mut()
            .push((key, sql, statement.clone()));
        Ok(statement)
    }

    /// Names the setting when the server does not know (or already has) a statement
    /// name, and forgets the connection's cached statements.
    fn own_error(&self, sql: &str, err: tokio_postgres::Error) -> Error {
        let Some(code) = err.code().cloned() else {
            return err.into();
        };
        if code != SqlState::INVALID_SQL_STATEMENT_NAME && code != SqlState::DUPLICATE_PSTATEMENT {
            return err.into();
        }
        self.statements.borrow_mut().clear();
        let server = err
            .as_db_error()
            .map(|db| db.message().to_string())
            .unwrap_or_default();
        let start: String = sql.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
        Error::Database {
            message: format!(
                "{server}: the named prepared statement \"{start} …\" did not stay with this \
                 connection; behind PgBouncer in transaction mode (before 1.21, or without \
                 max_prepared_statements) set prepared_statements: false"
            ),
            sqlstate: code.code().to_string(),
        }
    }

    /// Whether this process found the record table complete
    /// ([`super::schema::ensure`]).
    pub fn schema_checked(&self) -> &AtomicBool {
        &self.schema_checked
    }

    /// Mutable access to the underlying client (migrations).
    pub fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// Splits typed parameters into the statement's types and the values to bind.
fn split<'a>(
    params: &[(&'a (dyn ToSql + Sync), Type)],
) -> (Vec<Type>, Vec<&'a (dyn ToSql + Sync)>) {
    params.iter().map(|(v, t)| (t.clone(), *v)).unzip()
}

impl Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

struct Owned {
    pid: u32,
    /// Taken when dropped.
    runtime: Option<Runtime>,
    pool: Pool,
}

/// Clones of a pool that are no user of it: its owner's, and the repeat bookkeeping's
/// background writer's ([`Bookkeeper::run`]).
const OWN_CLONES: usize = 2;

impl Owned {
    /// Waits (polling every 20 ms) until no call, connection, transaction or live
    /// heartbeat uses the pool any more, writes its queued repeat bookkeeping (a failure is
    /// dropped with the pool: telemetry only), then closes it (on drop).
    fn close_when_idle(self) {
        // The heartbeat timer's task, once started, keeps a clone for good: it is no
        // user. Live heartbeats hold no clone, so they are waited for by count: closing
        // the pool under them would stop renewing claims whose bodies still run.
        let heartbeats = self.pool.heartbeats().clone();
        while Arc::strong_count(&self.pool.users) > OWN_CLONES + heartbeats.tasks() as usize
            || heartbeats.live() > 0
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self
            .pool
            .bookkeeper()
            .settle(&self.pool, &Interrupt::none());
    }
}

impl Drop for Owned {
    /// Closes the pool's connections (each idle one now, each in use as it comes back)
    /// and stops its runtime, without ever blocking the dropping thread (a Ruby GC) on
    /// the runtime's threads. Never reached in a forked child: see [`Store::pool`].
    fn drop(&mut self) {
        self.pool.inner.close();
        self.pool.reserve.close();
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
fn of_this_process(owned: &Option<Owned>) -> Option<Pool> {
    owned
        .as_ref()
        .filter(|o| o.pid == std::process::id())
        .map(|o| o.pool.clone())
}

impl Store {
    /// Validates `config` (without connecting) and returns an idle store.
    ///
    /// Errors: [`Error::Config`] for an invalid configuration.
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
    /// Errors: [`Error::Config`] if the configuration cannot build a pool,
    /// [`Error::Connection`] if the background runtime cannot start.
    pub fn pool(&self) -> Result<Pool> {
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
        pool.background().spawn(Bookkeeper::run(pool.clone()));
        *owned = Some(built);
        Ok(pool)
    }

    /// The pool of the current process if it was built already ([`Store::pool`] builds
    /// it), never building one: for work that only concerns a pool in use, such as
    /// writing its queued repeat bookkeeping.
    pub fn built_pool(&self) -> Option<Pool> {
        of_this_process(&self.owned.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn build(&self) -> Result<Owned> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(self.config.pool_size.max(1) + RESERVE_SIZE + 2)
            .thread_name("idempotent_job")
            .enable_all()
            .build()
            .map_err(|e| Error::connection(format!("cannot start the tokio runtime: {e}")))?;
        let tls = super::tls::connector(&self.config.tls()?)?;
        let schema_checked = Arc::new(AtomicBool::new(false));
        let pool_of = |size: usize| -> Result<managed::Pool<Manager>> {
            let manager = Manager {
                pg_config: self.config.pg_config()?,
                tls: tls.clone(),
                connect_timeout: self.config.connect_timeout(),
                prepared_statements: self.config.prepared_statements,
                schema_checked: schema_checked.clone(),
            };
            managed::Pool::builder(manager)
                .max_size(size)
                .runtime(deadpool::Runtime::Tokio1)
                .wait_timeout(Some(self.config.checkout_timeout()))
                .build()
                .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))
        };
        let inner = pool_of(self.config.pool_size)?;
        let reserve = pool_of(RESERVE_SIZE)?;
        let pid = std::process::id();
        Ok(Owned {
            pid,
            pool: Pool {
                inner,
                tls,
                background: runtime.handle().clone(),
                bookkeeper: Default::default(),
                pid,
                reserve,
                deadline: self.config.deadline(),
                users: Arc::new(()),
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
        // On failure the closure, and the pool with it, is dropped: closed at once.
        let _ = std::thread::Builder::new()
            .name("idempotent_job-close".into())
            .spawn(move || owned.close_when_idle());
    }

    /// Runs `f` with this process's pool on the calling thread, uninterruptibly. For
    /// Rust callers and tests; the Ruby layer passes an [`Interrupt`] wired to Ruby's
    /// unblocking function instead (see `src/ruby/gvl.rs`).
    pub fn run<T>(&self, f: impl FnOnce(&Pool, &Interrupt<'_>) -> Result<T>) -> Result<T> {
        let pool = self.pool()?;
        f(&pool, &Interrupt::none())
    }

    /// [`with_conn`] on this process's pool, uninterruptibly (see [`Store::run`]).
    pub fn with_conn<T>(&self, op: impl AsyncFnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        self.run(|pool, interrupt| with_conn(pool, interrupt, op))
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
        drop(owned); // closes the pool (see `Owned`'s Drop)
    }
}
