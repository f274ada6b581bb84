//! The circuit breaker over PostgreSQL ([`Circuit`]): when calls fail fast, and how
//! a call's end opens or closes it.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

use super::*;

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
pub(super) struct Circuit {
    pub(super) open_until: Option<Instant>,
    pub(super) trips: u32,
    pub(super) last: String,
    /// When a call (either lane) last had an answer from the server: a call that spent
    /// its deadline with no answer while another was answered meanwhile waited on
    /// something (a row lock), not on a dead or frozen server, and opens nothing.
    pub(super) answered: Option<Instant>,
}

impl Circuit {
    pub(super) fn open_for(trips: u32) -> Duration {
        Duration::from_secs_f64(
            (CIRCUIT_FIRST_OPEN_SECONDS * 2f64.powi(trips.saturating_sub(1).min(16) as i32))
                .min(CIRCUIT_MAX_OPEN_SECONDS),
        )
    }
}

/// Whether a call's result came from the server: a success, or an error it sent (with
/// a SQLSTATE).
pub(super) fn answered<T>(result: &Result<T>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) => e.sqlstate().is_some(),
    }
}

impl Pool {
    /// Lets a call through the circuit ([`Circuit`]): Ok when closed, or when its open
    /// time has passed (this call is the one that tries; others keep failing fast for
    /// up to a deadline while it runs).
    ///
    /// Errors: a retryable [`Error::Connection`] while the circuit is open.
    pub(super) fn admit(&self) -> Result<()> {
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
    pub(super) fn settle<T>(&self, result: &Result<T>, started: Instant, until: Instant) {
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
    pub(super) fn heard<T>(&self, result: &Result<T>) {
        if answered(result) {
            let mut circuit = self.circuit.lock().unwrap_or_else(|e| e.into_inner());
            circuit.answered = Some(Instant::now());
        }
    }
}
