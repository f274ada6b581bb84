//! Lease heartbeats: while a job body runs, a task on the native runtime renews the
//! claim's lease about every third of the lease, so a long job keeps its claim and a
//! dead process loses it within one lease. No Ruby thread (and no GVL) is involved.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use uuid::Uuid;

use super::claim::{fenced, Fenced};
use super::error::Error;
use super::store::{with_conn, Interrupt, Pool};

/// What a heartbeat saw, read when it is stopped.
#[derive(Debug, Default)]
pub struct HeartbeatState {
    renewals: AtomicU64,
    lost: AtomicBool,
    max_run_reached: AtomicBool,
    last_error: Mutex<Option<String>>,
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
        let state = Arc::new(HeartbeatState::default());
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
                let renewed = tokio::task::spawn_blocking(move || {
                    with_conn(&pool, &Interrupt::none(), async |c| {
                        fenced(c, Fenced::Renew, &job_type, &key, token, None).await
                    })
                })
                .await
                .unwrap_or_else(|e| Err(Error::Panic(format!("heartbeat renewal: {e}"))));
                match renewed {
                    Ok(()) => {
                        task_state.renewals.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(Error::LostClaim { .. }) => {
                        task_state.lost.store(true, Ordering::SeqCst);
                        break;
                    }
                    Err(e) => {
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
        HeartbeatReport {
            renewals: self.state.renewals.load(Ordering::SeqCst),
            lost: self.state.lost.load(Ordering::SeqCst),
            max_run_reached: self.state.max_run_reached.load(Ordering::SeqCst),
            last_error: self
                .state
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
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
