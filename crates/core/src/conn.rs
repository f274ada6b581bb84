//! One PostgreSQL connection and how a statement's I/O is driven.
//!
//! **The calling thread drives its own statement.** Every pooled connection owns a
//! small current-thread tokio runtime; its socket is registered with that runtime's
//! reactor, and its `tokio_postgres::Connection` future is kept next to the client
//! instead of being spawned. `drive` polls the connection together with the
//! statement's future inside that runtime's `block_on`, on the thread that asked (a
//! Ruby or Python thread with the GVL/GIL released): the request is written, and the
//! answer read, by the caller itself. No other thread is woken per statement (the
//! synchronous `postgres` crate works the same way).
//!
//! **Interrupts.** Every blocking call takes an [`Interrupt`]: another thread wakes
//! it ([`Interrupt::notifier`]); the blocked call then asks its owner, on its own
//! thread, whether to carry on (the same future is resumed: nothing is sent twice) or
//! to give up ([`Error::Interrupted`]).

use std::cell::RefCell;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::Notify;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};

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
    /// The instant the caller's whole call must end by, when it is sooner than each
    /// database call's own deadline ([`Interrupt::end_by`]).
    end_by: std::sync::Mutex<Option<Instant>>,
}

impl Interrupt<'static> {
    /// An interrupt nothing ever wakes (Rust callers, tests, heartbeats).
    pub fn none() -> Self {
        Interrupt {
            notify: Notify::new(),
            on_wake: None,
            end_by: std::sync::Mutex::new(None),
        }
    }
}

impl<'a> Interrupt<'a> {
    /// An interrupt that asks `on_wake` (on the blocked thread) whether to give up.
    pub fn new(on_wake: &'a dyn Fn() -> bool) -> Self {
        Interrupt {
            notify: Notify::new(),
            on_wake: Some(on_wake),
            end_by: std::sync::Mutex::new(None),
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

    /// Bounds every database call made with this interrupt from now on to end by
    /// `until` as well as by its own deadline (`None`: its own deadline only): a caller
    /// that promised to return within a time (a delivery's `wait:`, the enqueue check)
    /// sets it before its calls and clears it before the work after them (a body, a
    /// completion). A call cut short by it ends with the deadline's error.
    pub fn end_by(&self, until: Option<Instant>) {
        *self.end_by.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }

    /// `until`, or the bound set by [`Interrupt::end_by`] when that is sooner.
    pub fn bound(&self, until: Instant) -> Instant {
        match *self.end_by.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(end) if end < until => end,
            _ => until,
        }
    }
}

/// A pooled connection's `tokio_postgres::Connection`: the future that does its I/O.
pub(crate) type Driver =
    Pin<Box<dyn Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send>>;

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
/// ([`crate::config::Config::deadline`]): every pooled connection stayed in use, or a new one was not
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

/// The error of a call still unanswered at its deadline ([`crate::config::Config::deadline`]).
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
pub(crate) struct OwnRuntime(pub(crate) Option<Runtime>);

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
    pub(crate) runtime: OwnRuntime,
    /// `None` once the connection ended (closed by the server, a broken socket).
    pub(crate) driver: Option<Driver>,
    pub(crate) conn: Conn,
}

/// A connection error met before the server answered (refused, unreachable, a name
/// that does not resolve) with the addresses and ports it tried (a `hostaddr`'s, with
/// its host when both are given) and what to check, so a wrong `database_url` is
/// recognised from the message alone. Errors the server sent (they carry a SQLSTATE: a
/// wrong database, role or password) already say so.
fn naming_target(err: Error, config: &tokio_postgres::Config) -> Error {
    match err {
        Error::Connection {
            message,
            sqlstate: None,
        } => {
            let (hosts, addrs, ports) = (
                config.get_hosts(),
                config.get_hostaddrs(),
                config.get_ports(),
            );
            // An IPv6 address in brackets, as a URL writes it ("[::1]:5432", not "::1:5432").
            let at = |name: &str, port: u16| {
                if name.contains(':') {
                    format!("[{name}]:{port}")
                } else {
                    format!("{name}:{port}")
                }
            };
            // The driver connects to the hostaddr when given (libpq's rule; the host then
            // only names the server for TLS), to the host otherwise.
            let targets: Vec<String> = (0..hosts.len().max(addrs.len()))
                .map(|i| {
                    let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                    match (addrs.get(i), hosts.get(i)) {
                        (Some(addr), Some(tokio_postgres::config::Host::Tcp(name)))
                            if !name.is_empty() =>
                        {
                            format!("{} (host {name})", at(&addr.to_string(), port))
                        }
                        (Some(addr), _) => at(&addr.to_string(), port),
                        (None, Some(tokio_postgres::config::Host::Tcp(name))) => at(name, port),
                        #[cfg(unix)]
                        (None, Some(tokio_postgres::config::Host::Unix(path))) => {
                            format!("{}/.s.PGSQL.{port}", path.display())
                        }
                        (None, None) => format!("?:{port}"),
                    }
                })
                .collect();
            Error::Connection {
                message: format!(
                    "{message} (connecting to {}: check database_url, and that PostgreSQL \
                     runs and accepts connections there)",
                    targets.join(", ")
                ),
                sqlstate: None,
            }
        }
        other => other,
    }
}

impl PgConn {
    /// Opens a connection on a fresh current-thread runtime, on the calling thread,
    /// within `timeout` (TCP connect, TLS, startup and authentication).
    pub(crate) fn connect(
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
        let (client, connection) = connected
            .map_err(|_| Error::Timeout {
                message:
                    "timed out connecting to PostgreSQL (connect_timeout): the server did not \
                      complete the connection start; check that it is reachable and healthy"
                        .into(),
                sqlstate: None,
            })?
            .map_err(|e| naming_target(Error::from(e), config))?;
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
    pub(crate) fn refresh(&mut self) -> bool {
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

    pub(crate) fn is_usable(&self) -> bool {
        self.driver.is_some() && !self.conn.client.is_closed()
    }
}

/// The statement side of a pooled connection, handed to the work of
/// `pool::Pooled::run`: the client, and the connection's cache of the gem's own named
/// prepared statements. Derefs to `tokio_postgres::Client`.
pub struct Conn {
    pub(crate) client: Client,
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
    /// connection ([`crate::config::Config::prepared_statements`]).
    pub fn prepared_statements(&self) -> bool {
        self.prepared_statements
    }

    /// Runs one of the gem's own statements (a constant SQL text of
    /// [`crate::sql`]) with typed parameters and returns its rows, in one round trip.
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
    /// (`schema::ensure` sets it).
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
