//! The calls that retry on a fresh connection (see the module doc of [`crate::pool`]):
//! [`with_conn`], [`with_fresh_conn`], [`checkout_live`] and their back-off.

use std::time::{Duration, Instant};

use crate::conn::{checkout_deadline_error, Conn, Interrupt};
use crate::error::{Error, Result};

use super::*;

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
pub(super) fn pause(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    until: Instant,
    failures: u32,
) -> Result<bool> {
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

/// A connection error met at every attempt, saying so: attempts stop when the
/// deadline leaves no room for another pause and try, which can be before it ends.
pub(super) fn retried_until_deadline(err: Error, deadline: Duration) -> Error {
    match err {
        Error::Connection { message, sqlstate } => Error::Connection {
            message: format!(
                "{message} (connecting failed at every retry while the deadline of {} s left room for another)",
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
/// connection in time) or [`deadline_error`](crate::conn::deadline_error) (no answer in time); `op`'s own.
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
pub(super) fn fresh_conn_until<T>(
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
