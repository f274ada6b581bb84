//! What the gem does when a connection turns out dead: which calls are sent again on
//! a fresh connection, with what back-off, within which deadline. The I/O itself is
//! [`super::store`]'s; this module only decides.
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
//! * Everything ends within the deadline ([`crate::config::Config::deadline`]).

use std::time::{Duration, Instant};

use super::error::{Error, Result};
use super::store::{checkout_deadline_error, Conn, Interrupt, Lane, Pool, Pooled};

/// Errors after which a fresh connection may succeed where this one failed: the
/// connection closed or broke, the server was shutting down or refused connections
/// for now, or it is read-only (25006: it became a standby in a failover).
pub fn is_lost(err: &Error) -> bool {
    matches!(err, Error::Connection { .. }) || err.sqlstate() == Some("25006")
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
/// lost ([`is_lost`]); then it is discarded and true returned.
pub fn finish_unless_lost<T>(mut pooled: Pooled, result: &Result<T>) -> bool {
    match result {
        Err(e) if is_lost(e) => {
            pooled.discard();
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
/// connection in time) or [`super::store::deadline_error`] (no answer in time); `op`'s own.
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
    let until = Instant::now() + budget;
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
