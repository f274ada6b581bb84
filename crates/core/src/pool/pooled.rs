//! A connection checked out of the pool ([`Pooled`]): the one way a statement reaches
//! PostgreSQL, and what becomes of the connection after.

use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool::managed::{Object, PoolError};

use crate::conn::{deadline_error, drive, Conn, Interrupt, PgConn};
use crate::error::{Error, Result};

use super::*;

pub(super) fn pool_error(err: PoolError<Error>) -> Error {
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
    pub(super) object: Option<Object<Manager>>,
    pub(super) pool: Pool,
    pub(super) finished: bool,
    /// Given up mid-statement, or closed: never back to the pool.
    pub(super) spoiled: bool,
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
