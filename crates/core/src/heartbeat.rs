//! Lease heartbeats: while a job body runs, a task on the native runtime renews the
//! claim's lease about every third of the lease, so a long job keeps its claim and a
//! dead process loses it within one lease. No Ruby thread (and no GVL) is involved.
//!
//! A renewal is bounded by [`renewal_timeout`]: on a dead network it fails within
//! one interval instead of hanging, renewals never pile up (the next waits for the
//! last), and the report says the claim is in doubt as soon as a renewal failed or
//! none was confirmed for two thirds of the lease, so the running job can learn that
//! another delivery may take the operation over when the lease runs out.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use uuid::Uuid;

use super::claim::{fenced, Fenced};
use super::error::Error;
use super::retry::with_fresh_conn_within;
use super::store::{Interrupt, Lane, Pool};

/// What a heartbeat saw, read while it runs and when it is stopped.
#[derive(Debug)]
pub struct HeartbeatState {
    renewals: AtomicU64,
    failures: AtomicU64,
    /// The last renewal attempt failed (an error or its time-out).
    failing: AtomicBool,
    lost: AtomicBool,
    max_run_reached: AtomicBool,
    last_error: Mutex<Option<String>>,
    /// When the lease was last known good: the claim, then each confirmed renewal.
    confirmed_at: Mutex<Instant>,
    lease: Duration,
}

/// A snapshot of [`HeartbeatState`].
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatReport {
    /// Successful lease renewals.
    pub renewals: u64,
    /// A renewal found the claim no longer held (taken over after a missed renewal).
    pub lost: bool,
    /// The maximum run time passed and renewing stopped.
    pub max_run_reached: bool,
    /// The last renewal error other than a lost claim (the database was unreachable…).
    pub last_error: Option<String>,
    /// Renewals that failed (an error or a time-out), in total.
    pub failures: u64,
    /// Seconds since the lease was last known good (the claim or the last confirmed
    /// renewal).
    pub since_confirmed: f64,
    /// The claim may no longer be this delivery's: it was lost, the last renewal failed,
    /// or no renewal was confirmed for two thirds of the lease. Another delivery may
    /// take the operation over once the lease runs out.
    pub in_doubt: bool,
}

/// A running heartbeat. Stopping (or dropping) it ends the background task.
pub struct Heartbeat {
    stop: Arc<Notify>,
    state: Arc<HeartbeatState>,
    /// The process that started it: a forked child never signals the parent's task.
    pid: u32,
}

/// Renewal interval for a lease: a third of it, at least 10 ms (and at most a day).
pub fn interval_for(lease_seconds: f64) -> Duration {
    Duration::from_secs_f64(clamp_seconds(lease_seconds / 3.0).max(0.01))
}

/// Longest wait for one renewal: the renewal interval, at most the deadline
/// ([`crate::config::Config::deadline`]). A renewal still unanswered then is
/// abandoned (its connection discarded) and counted as failed.
pub fn renewal_timeout(interval: Duration, deadline: Duration) -> Duration {
    interval.min(deadline)
}

/// A duration in seconds made safe for `Duration`: NaN or negative → 0, capped at
/// ten years (callers validate; this only keeps bad input from panicking).
fn clamp_seconds(seconds: f64) -> f64 {
    if seconds.is_nan() {
        0.0
    } else {
        seconds.clamp(0.0, 315_360_000.0)
    }
}

impl Heartbeat {
    /// Starts renewing the claim `token` every [`interval_for`]`(lease_seconds)`, for
    /// at most `max_run_seconds` in total. The timer runs on `pool`'s background
    /// runtime; each renewal runs on one of its blocking threads, which drives the
    /// renewal's connection itself, so no caller's statement waits behind it.
    pub fn start(
        pool: &Pool,
        job_type: String,
        operation_key: String,
        token: Uuid,
        lease_seconds: f64,
        max_run_seconds: f64,
    ) -> Heartbeat {
        let stop = Arc::new(Notify::new());
        let state = Arc::new(HeartbeatState {
            renewals: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            max_run_reached: AtomicBool::new(false),
            last_error: Mutex::new(None),
            confirmed_at: Mutex::new(Instant::now()),
            lease: Duration::from_secs_f64(clamp_seconds(lease_seconds)),
        });
        let (task_stop, task_state, task_pool) = (stop.clone(), state.clone(), pool.clone());
        let interval = interval_for(lease_seconds);
        let deadline = Instant::now() + Duration::from_secs_f64(clamp_seconds(max_run_seconds));
        pool.background().spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = task_stop.notified() => break,
                    _ = tokio::time::sleep(interval) => {}
                }
                if Instant::now() >= deadline {
                    task_state.max_run_reached.store(true, Ordering::SeqCst);
                    break;
                }
                let (pool, job_type, key) =
                    (task_pool.clone(), job_type.clone(), operation_key.clone());
                let sent = Instant::now();
                let budget = renewal_timeout(interval, pool.deadline());
                // Repeated on a fresh connection if its own turns out dead, from the
                // pool or the reserve, within one renewal timeout.
                let renewed = tokio::task::spawn_blocking(move || {
                    with_fresh_conn_within(
                        &pool,
                        &Interrupt::none(),
                        Lane::Reserve,
                        budget,
                        async |c| fenced(c, Fenced::Renew, &job_type, &key, token, None).await,
                    )
                })
                .await
                .unwrap_or_else(|e| Err(Error::Panic(format!("heartbeat renewal: {e}"))));
                match renewed {
                    Ok(()) => {
                        task_state.renewals.fetch_add(1, Ordering::SeqCst);
                        task_state.failing.store(false, Ordering::SeqCst);
                        // The new lease counts from the statement, not its answer.
                        *task_state
                            .confirmed_at
                            .lock()
                            .unwrap_or_else(|p| p.into_inner()) = sent;
                    }
                    Err(Error::LostClaim { .. }) => {
                        task_state.lost.store(true, Ordering::SeqCst);
                        break;
                    }
                    Err(e) => {
                        task_state.failures.fetch_add(1, Ordering::SeqCst);
                        task_state.failing.store(true, Ordering::SeqCst);
                        *task_state
                            .last_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    }
                }
            }
        });
        Heartbeat {
            stop,
            state,
            pid: pool.pid(),
        }
    }

    /// Stops renewing (a renewal already under way may still land) and reports.
    pub fn stop(&self) -> HeartbeatReport {
        self.stop.notify_one();
        self.report()
    }

    /// What the heartbeat saw so far.
    pub fn report(&self) -> HeartbeatReport {
        let state = &self.state;
        let since_confirmed = state
            .confirmed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        let lost = state.lost.load(Ordering::SeqCst);
        let failing = state.failing.load(Ordering::SeqCst);
        HeartbeatReport {
            renewals: state.renewals.load(Ordering::SeqCst),
            lost,
            max_run_reached: state.max_run_reached.load(Ordering::SeqCst),
            last_error: state
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            failures: state.failures.load(Ordering::SeqCst),
            since_confirmed: since_confirmed.as_secs_f64(),
            in_doubt: lost || failing || since_confirmed * 3 > state.lease * 2,
        }
    }
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("report", &self.report())
            .finish()
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        // In a forked child the task does not exist, and the Notify's lock may have
        // been held by the parent's runtime thread at fork time: leave it alone.
        if self.pid == std::process::id() {
            self.stop.notify_one();
        }
    }
}
