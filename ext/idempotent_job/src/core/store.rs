//! The per-process tokio runtime and deadpool-postgres pool.
//!
//! Both are created lazily on first use and remember the process id that created
//! them. A forked child (Puma/Unicorn workers, sidekiqswarm, parallel tests) finds a
//! different pid and builds its own; the parent's runtime and sockets are leaked in
//! the child, never dropped or touched, because dropping them there would hang
//! (the runtime's worker threads do not exist after a fork).

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Object, RecyclingMethod};
use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::Config;
use super::error::{Error, Result};

/// The pool of connections, with the TLS connector its cancel requests need.
#[derive(Clone)]
pub struct Pool {
    inner: deadpool_postgres::Pool,
    tls: MakeRustlsConnect,
    /// Send the gem's own statements as named prepared statements, cached per
    /// connection ([`Config::prepared_statements`]).
    prepared_statements: bool,
    /// The process that built the pool: the only one it ever serves ([`Store::handle`]
    /// builds another in a forked child).
    pid: u32,
    /// Whether the record table's shape was found complete ([`super::schema::ensure`]).
    schema_checked: Arc<AtomicBool>,
    /// A connection of its own for the changes that end or keep a claim (completions,
    /// releases, renewals): they never wait behind claims that hold the whole pool
    /// ([`Lane::Reserve`]).
    reserve: deadpool_postgres::Pool,
    /// [`Config::deadline`]: the bound on one call, retries included.
    deadline: Duration,
}

impl Pool {
    /// The process this pool (and anything checked out of it) belongs to.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The bound on one call ([`Config::deadline`]).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }
}

/// What a process needs to talk to PostgreSQL: the runtime that drives the
/// connections and the pool of them.
#[derive(Clone)]
pub struct Handle {
    pub runtime: Arc<Runtime>,
    pub pool: Pool,
}

struct Owned {
    pid: u32,
    handle: Handle,
}

/// A configured connection to one database. Cheap to create: nothing connects until
/// the first [`Store::handle`].
pub struct Store {
    config: Config,
    owned: Mutex<Option<Owned>>,
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

    /// The runtime and pool of the current process, created on first call and
    /// re-created (the old ones leaked) when the pid changed since.
    ///
    /// Errors: [`Error::Config`] if the configuration cannot build a pool,
    /// [`Error::Connection`] if the runtime cannot start.
    pub fn handle(&self) -> Result<Handle> {
        let pid = std::process::id();
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = owned.as_ref() {
            if o.pid == pid {
                return Ok(o.handle.clone());
            }
        }
        if let Some(stale) = owned.take() {
            // Inherited from the parent process: never drop it here.
            std::mem::forget(stale);
        }
        let handle = self.build()?;
        *owned = Some(Owned {
            pid,
            handle: handle.clone(),
        });
        Ok(handle)
    }

    fn build(&self) -> Result<Handle> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("idempotent_job")
            .enable_all()
            .build()
            .map_err(|e| Error::connection(format!("cannot start the tokio runtime: {e}")))?;
        let tls = super::tls::connector(&self.config.tls()?)?;
        let manager = Manager::from_config(
            self.config.pg_config()?,
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let inner = self.pool_of(manager, self.config.pool_size)?;
        let reserve = self.pool_of(
            Manager::from_config(
                self.config.pg_config()?,
                tls.clone(),
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            ),
            RESERVE_SIZE,
        )?;
        Ok(Handle {
            runtime: Arc::new(runtime),
            pool: Pool {
                inner,
                tls,
                prepared_statements: self.config.prepared_statements,
                pid: std::process::id(),
                schema_checked: Arc::default(),
                reserve,
                deadline: self.config.deadline(),
            },
        })
    }

    fn pool_of(&self, manager: Manager, size: usize) -> Result<deadpool_postgres::Pool> {
        deadpool_postgres::Pool::builder(manager)
            .max_size(size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(self.config.checkout_timeout()))
            // tokio-postgres's connect_timeout covers the TCP connect only: bound the
            // whole connection start (TLS, startup, authentication) too.
            .create_timeout(Some(self.config.connect_timeout()))
            .recycle_timeout(Some(self.config.connect_timeout()))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))
    }

    /// Runs `f` with this process's pool on its runtime, blocking the calling thread.
    /// For Rust callers and tests; the Ruby layer releases the GVL around the same
    /// futures instead (see `src/ruby/gvl.rs`).
    pub fn block_on<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Pool) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let handle = self.handle()?;
        handle.runtime.block_on(f(handle.pool.clone()))
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
        let Handle { runtime, pool } = owned.handle;
        pool.inner.close();
        pool.reserve.close();
        drop(pool);
        // Never block the dropping thread (a Ruby GC) on the runtime's threads.
        release_runtime(runtime);
    }
}

/// Lets go of a reference to a runtime without ever blocking the calling thread (a
/// Ruby GC): when it was the last one, the runtime shuts down in the background.
pub fn release_runtime(runtime: Arc<Runtime>) {
    if let Ok(runtime) = Arc::try_unwrap(runtime) {
        runtime.shutdown_background();
    }
}

/// Connections kept aside for [`Lane::Reserve`], per process.
pub const RESERVE_SIZE: usize = 1;

/// Which connections a call may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The pool (claims, reads, purges, operators' calls).
    Main,
    /// The pool or, whichever is free first, the reserve connection: for the changes
    /// that end or keep a claim whose body has run or is running (completions,
    /// releases, renewals…), so claims waiting on a row lock elsewhere can never hold
    /// every connection while a finished body's completion waits for one.
    Reserve,
}

/// Runs `op` on a connection checked out of `pool` for this one operation, then
/// returns it to the pool, all within the pool's deadline ([`Config::deadline`]). If
/// the returned future is dropped before `op` finished (an interrupt, the deadline),
/// the connection is detached and its statement cancelled instead (see [`Conn`]).
///
/// `op` runs once: only a failure before its statement went out (no connection could
/// be made, the checked-out one was already closed) is retried, on a fresh connection,
/// until the deadline. For statements that are safe to send twice, see
/// [`with_fresh_conn`].
///
/// Errors: [`Error::Connection`] when no connection can be had, [`Error::Timeout`]
/// past the deadline; `op`'s own errors.
pub async fn with_conn<T, F>(pool: &Pool, op: F) -> Result<T>
where
    F: AsyncFnOnce(&Conn) -> Result<T>,
{
    let started = Instant::now();
    let attempt = async {
        let mut conn = checkout_live(pool, Lane::Main, started).await?;
        let result = op(&conn).await;
        conn.finish_unless_lost(&result);
        result
    };
    bounded(pool.deadline, started, attempt).await
}

/// Like [`with_conn`] for a statement that is safe to send again even if its first
/// sending may have committed (the claim with the same fencing token, every fenced
/// change, reads, purge batches): when the connection turns out dead under it (closed,
/// an I/O error, the server shutting down or read-only after a failover), the
/// connection is discarded, dead idle ones are dropped from the pool, and `op` runs
/// again on a fresh connection, with a short back-off, until the deadline.
///
/// Errors: the last error once the deadline leaves no room for another attempt;
/// [`Error::Timeout`] when the deadline passes during an attempt; `op`'s own errors.
pub async fn with_fresh_conn<T, F>(pool: &Pool, lane: Lane, op: F) -> Result<T>
where
    F: AsyncFn(&Conn) -> Result<T>,
{
    let mut attempts = Attempts::new(pool, lane);
    let deadline = attempts.started;
    let call = async {
        loop {
            let mut conn = attempts.conn().await?;
            let result = op(&conn).await;
            if !attempts.again(&mut conn, &result).await {
                return result;
            }
        }
    };
    bounded(pool.deadline, deadline, call).await
}

/// The attempts of one call that may be repeated on fresh connections (what
/// [`with_fresh_conn`] does, for callers that cannot hand over a closure, such as a
/// spawned task): `conn` for each attempt, then `again` with its result.
pub struct Attempts<'p> {
    pool: &'p Pool,
    lane: Lane,
    /// When the call began: the deadline counts from here.
    pub started: Instant,
    failures: u32,
}

impl<'p> Attempts<'p> {
    /// The first attempt of a call on `lane` of `pool`, starting now.
    pub fn new(pool: &'p Pool, lane: Lane) -> Self {
        Attempts {
            pool,
            lane,
            started: Instant::now(),
            failures: 0,
        }
    }

    /// A live connection for the next attempt (see [`checkout_live`]).
    ///
    /// Errors: [`Error::Connection`], [`Error::Timeout`].
    pub async fn conn(&self) -> Result<Conn> {
        checkout_live(self.pool, self.lane, self.started).await
    }

    /// After an attempt on `conn`: true when `result` says the connection was lost and
    /// the deadline leaves room for another attempt (the connection is then discarded
    /// and the back-off waited); false when `result` is the answer (the connection
    /// goes back to the pool, or is discarded if lost).
    pub async fn again<T>(&mut self, conn: &mut Conn, result: &Result<T>) -> bool {
        if !conn.finish_unless_lost(result) {
            return false;
        }
        self.failures += 1;
        pause_before_retry(self.pool, self.started, self.failures).await
    }
}

/// Checks a live connection out of the pool for a longer use (a transaction), within
/// the deadline; see [`with_conn`] for what is retried.
///
/// Errors: [`Error::Connection`], [`Error::Timeout`].
pub async fn checkout_bounded(pool: &Pool) -> Result<Conn> {
    let started = Instant::now();
    bounded(
        pool.deadline,
        started,
        checkout_live(pool, Lane::Main, started),
    )
    .await
}

/// Checks a live connection out of `lane`: a connection already closed (its backend
/// killed, the server restarted) is discarded before use, and a failure to connect is
/// retried with back-off until the deadline.
async fn checkout_live(pool: &Pool, lane: Lane, started: Instant) -> Result<Conn> {
    let mut failures = 0u32;
    loop {
        let result = Conn::checkout_in(pool, lane).await;
        match result {
            Ok(conn) if !conn.is_closed() => return Ok(conn),
            Ok(conn) => conn.discard(),
            Err(e) if !is_lost(&e) => return Err(e),
            Err(e) => {
                if failures > 0 && !pause_before_retry(pool, started, failures).await {
                    return Err(e);
                }
            }
        }
        failures += 1;
    }
}

/// Errors after which a fresh connection may succeed where this one failed: the
/// connection closed or broke, the server was shutting down or refused connections
/// for now, or it is read-only (25006: it became a standby in a failover).
fn is_lost(err: &Error) -> bool {
    matches!(err, Error::Connection { .. }) || err.sqlstate() == Some("25006")
}

/// Waits before retry number `failures` (20 ms, doubling, at most 1 s) and drops the
/// pool's idle connections that have closed meanwhile. False when the deadline leaves
/// no room for the wait and another attempt.
async fn pause_before_retry(pool: &Pool, started: Instant, failures: u32) -> bool {
    let pause = Duration::from_millis(20 << failures.min(6)).min(Duration::from_secs(1));
    if started.elapsed() + pause * 2 >= pool.deadline {
        return false;
    }
    tokio::time::sleep(pause).await;
    for idle in [&pool.inner, &pool.reserve] {
        idle.retain(|client, _| !client.is_closed());
    }
    true
}

/// Runs `call` until `deadline` after `started`; past it `call` is dropped (its
/// connection detached and cancelled) and a retryable [`Error::Timeout`] returned.
pub async fn bounded<T>(
    deadline: Duration,
    started: Instant,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    let left = deadline.saturating_sub(started.elapsed());
    tokio::time::timeout(left, call).await.unwrap_or_else(|_| {
        Err(Error::Timeout {
            message: format!(
                "no answer from PostgreSQL within the deadline of {} s (deadline): the server \
                 or the network is not responding; the connection was discarded",
                deadline.as_secs_f64()
            ),
            sqlstate: None,
        })
    })
}

/// A pooled connection checked out for one operation.
///
/// Call [`Conn::finish`] once the operation has its answer: the connection goes back
/// to the pool. If the operation's future is dropped before that (the Ruby thread was
/// interrupted, a timeout fired), the connection may still be running a statement:
/// it is detached from the pool, its statement is cancelled server-side and it is
/// closed, so the next caller never queues behind an orphaned query.
pub struct Conn {
    object: Option<Object>,
    /// Cancel requests go the way the connection went (TLS or not).
    tls: MakeRustlsConnect,
    finished: bool,
    /// The runtime the connection lives on: the cancel request is spawned there even
    /// when the operation's future is dropped outside it (after an interrupt).
    runtime: tokio::runtime::Handle,
    /// See [`Conn::query_own`].
    prepared_statements: bool,
    /// The process that checked it out: in a forked child the connection belongs to
    /// the parent's pool and runtime, which must not be touched (see `Drop`).
    pid: u32,
    /// The pool's [`super::schema::ensure`] flag.
    schema_checked: Arc<AtomicBool>,
    /// See [`Conn::deadline`].
    deadline: Duration,
}

impl Conn {
    /// Checks a connection out of `pool`, waiting at most the configured checkout
    /// timeout. Errors: [`Error::Connection`].
    pub async fn checkout(pool: &Pool) -> Result<Conn> {
        Self::checkout_in(pool, Lane::Main).await
    }

    /// Checks a connection out of `lane` (see [`Lane`]), waiting at most the
    /// configured checkout timeout. Errors: [`Error::Connection`], [`Error::Timeout`].
    pub async fn checkout_in(pool: &Pool, lane: Lane) -> Result<Conn> {
        let object = match lane {
            Lane::Main => pool.inner.get().await?,
            Lane::Reserve => tokio::select! {
                biased;
                object = pool.inner.get() => object?,
                object = pool.reserve.get() => object?,
            },
        };
        Ok(Conn {
            object: Some(object),
            tls: pool.tls.clone(),
            finished: false,
            runtime: tokio::runtime::Handle::current(),
            prepared_statements: pool.prepared_statements,
            pid: pool.pid,
            schema_checked: pool.schema_checked.clone(),
            deadline: pool.deadline,
        })
    }

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
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        if !self.prepared_statements {
            return Ok(self.query_typed(sql, params).await?);
        }
        let (types, values) = split(params);
        let statement = self.prepare_own(sql, &types).await?;
        self.query(&statement, &values)
            .await
            .map_err(|e| self.own_error(sql, e))
    }

    /// Like [`Conn::query_own`], for a statement whose affected row count is the
    /// answer.
    ///
    /// Errors: see [`Conn::query_own`].
    pub async fn execute_own(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64> {
        if !self.prepared_statements {
            return Ok(self.execute_typed(sql, params).await?);
        }
        let (types, values) = split(params);
        let statement = self.prepare_own(sql, &types).await?;
        self.execute(&statement, &values)
            .await
            .map_err(|e| self.own_error(sql, e))
    }

    async fn prepare_own(&self, sql: &str, types: &[Type]) -> Result<tokio_postgres::Statement> {
        let object = self.object.as_ref().expect("connection present until drop");
        object
            .prepare_typed_cached(sql, types)
            .await
            .map_err(|e| self.own_error(sql, e))
    }

    /// Names the setting when the server does not know (or already has) a statement
    /// name, and forgets the connection's cached statements.
    fn own_error(&self, sql: &str, err: tokio_postgres::Error) -> Error {
        let code = err.code().cloned();
        let (Some(code), Some(object)) = (code, self.object.as_ref()) else {
            return err.into();
        };
        if code != SqlState::INVALID_SQL_STATEMENT_NAME && code != SqlState::DUPLICATE_PSTATEMENT {
            return err.into();
        }
        object.statement_cache.clear();
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

    /// Whether this connection's pool found the record table complete
    /// ([`super::schema::ensure`]).
    pub fn schema_checked(&self) -> &AtomicBool {
        &self.schema_checked
    }

    /// Marks the operation as answered: on drop the connection returns to the pool.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// The bound on one call of this connection's pool ([`Config::deadline`]).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// After an operation: returns the connection to the pool, unless `result` says
    /// the connection is lost ([`is_lost`]); then it is discarded and true returned.
    fn finish_unless_lost<T>(&mut self, result: &Result<T>) -> bool {
        match result {
            Err(e) if is_lost(e) => {
                self.take_and_close();
                true
            }
            _ => {
                self.finish();
                false
            }
        }
    }

    /// Closes a connection found dead, without a cancel request (there is nothing to
    /// cancel) and without returning it to the pool.
    fn discard(mut self) {
        self.take_and_close();
    }

    fn take_and_close(&mut self) {
        if let Some(object) = self.object.take() {
            if self.pid == std::process::id() {
                drop(Object::take(object));
            } else {
                std::mem::forget(object);
            }
        }
    }

    /// Mutable access to the underlying client (transactions, migrations).
    pub fn client_mut(&mut self) -> &mut tokio_postgres::Client {
        self.object.as_mut().expect("connection present until drop")
    }
}

/// Splits typed parameters into the statement's types and the values to bind.
fn split<'a>(
    params: &[(&'a (dyn ToSql + Sync), Type)],
) -> (Vec<Type>, Vec<&'a (dyn ToSql + Sync)>) {
    params.iter().map(|(v, t)| (t.clone(), *v)).unzip()
}

impl Deref for Conn {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &Self::Target {
        self.object.as_ref().expect("connection present until drop")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(object) = self.object.take() else {
            return;
        };
        if self.pid != std::process::id() {
            // Inherited through fork (a transaction handle garbage-collected in the
            // child): returning it to the parent's pool, or spawning a cancel on the
            // parent's runtime, could wait forever on a lock another thread held at
            // fork time. The socket is shared with the parent: leak it.
            std::mem::forget(object);
            return;
        }
        if self.finished {
            return; // `object` drops here and goes back to the pool
        }
        let client = Object::take(object);
        let cancel = client.cancel_token();
        let tls = self.tls.clone();
        let deadline = self.deadline;
        self.runtime.spawn(async move {
            // On a dead network the cancel request gets no answer either.
            let _ = tokio::time::timeout(deadline, cancel.cancel_query(tls)).await;
            drop(client);
        });
    }
}
