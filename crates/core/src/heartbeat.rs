//! Lease heartbeats: while a job body runs, its claim's lease is renewed about every
//! third of the lease, so a long job keeps its claim and a dead process loses it
//! within one lease. One long-lived timer per process ([`Timer`], on the pool's
//! background runtime) renews every live claim; starting and stopping a claim's
//! heartbeat only registers and unregisters it. No Ruby thread (and no GVL) is
//! involved.
//!
//! A renewal is bounded by [`renewal_timeout`]: on a dead network it fails within
//! one interval instead of hanging, renewals never pile up (the next waits for the
//! last), and the report says the claim is in doubt as soon as a renewal failed or
//! none was confirmed for two thirds of the lease, so the running job can learn that
//! another delivery may take the operation over when the lease runs out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use uuid::Uuid;

use crate::conn::Interrupt;
use crate::error::Error;
use crate::fenced::{fenced, Fenced};
use crate::pool::{with_fresh_conn_within, Lane, Pool};

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

/// A running heartbeat: one claim registered with its pool's [`Timer`]. Stopping (or
/// dropping) it takes the claim off the timer.
pub struct Heartbeat {
    timer: Arc<Timer>,
    id: u64,
    state: Arc<HeartbeatState>,
    /// The process that started it: a forked child never touches the parent's timer.
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

/// One live claim on the timer.
struct Entry {
    job_type: Arc<str>,
    operation_key: Arc<str>,
    token: Uuid,
    interval: Duration,
    /// When its next renewal is due (a renewal's end plus the interval).
    due: Instant,
    /// When renewing stops ([`HeartbeatReport::max_run_reached`]).
    deadline: Instant,
    /// A renewal is under way: the next is scheduled when it ends.
    renewing: bool,
    state: Arc<HeartbeatState>,
}

#[derive(Default)]
struct Schedule {
    entries: HashMap<u64, Entry>,
    next_id: u64,
    /// When the timer task wakes next (`None` before it started): a claim due earlier
    /// wakes it; one due later costs the timer nothing.
    wakes_at: Option<Instant>,
    /// The shortest interval met, how long the timer sleeps with no claim to renew.
    idle: Option<Duration>,
    /// Renewals sent to a blocking thread and not yet ended ([`Timer::busy`]), whether
    /// their claim was stopped meanwhile or not.
    in_flight: usize,
}

/// The lease heartbeat of one pool: ONE long-lived task on the pool's background
/// runtime renews every live claim of the process when its renewal is due, instead of
/// a task per claim. Starting and stopping a heartbeat only adds or removes an entry
/// under a lock: the timer task is woken only when a new claim is due before its
/// next wake-up (the first claim, or a shorter lease than any before), so a
/// delivery's heartbeat costs no thread wake-up and no task.
///
/// Each renewal runs on one of the runtime's blocking threads, which drives the
/// renewal's connection itself, so no caller's statement waits behind it and one slow
/// renewal never delays another claim's.
#[derive(Default)]
pub struct Timer {
    schedule: Mutex<Schedule>,
    wake: Notify,
    /// Timer tasks spawned (1 once a heartbeat started; the pool's runtime never
    /// loses it).
    tasks: AtomicU64,
}

impl Timer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims being renewed now.
    pub fn live(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether a claim is registered or a renewal is under way (of a claim stopped
    /// meanwhile too): its pool's owner waits for neither before stopping the runtime
    /// the renewals run on. Read under the lock the timer task takes renewals under,
    /// so a renewal it took cannot be missed.
    pub fn busy(&self) -> bool {
        let schedule = self.lock();
        !schedule.entries.is_empty() || schedule.in_flight > 0
    }

    /// Timer tasks this timer has spawned: 1 once any heartbeat started, whatever the
    /// number of claims.
    pub fn tasks(&self) -> u64 {
        self.tasks.load(Ordering::SeqCst)
    }

    /// Registers a claim; returns its id. Wakes the task only if the claim is due
    /// before the task's next wake-up (or starts the task).
    fn add(self: &Arc<Self>, pool: &Pool, entry: Entry) -> u64 {
        let (id, wake, start) = {
            let mut schedule = self.lock();
            let id = schedule.next_id;
            schedule.next_id += 1;
            schedule.idle = Some(
                schedule
                    .idle
                    .map_or(entry.interval, |i| i.min(entry.interval)),
            );
            let start = schedule.wakes_at.is_none();
            let wake = !start && schedule.wakes_at.is_some_and(|at| entry.due < at);
            if start {
                // The task computes its first wake-up; until then nobody else starts one.
                schedule.wakes_at = Some(entry.due);
            }
            schedule.entries.insert(id, entry);
            (id, wake, start)
        };
        if start {
            self.tasks.fetch_add(1, Ordering::SeqCst);
            pool.background()
                .spawn(run_timer(self.clone(), pool.clone()));
        } else if wake {
            self.wake.notify_one();
        }
        id
    }

    /// Takes a claim off the timer (a renewal under way may still land). Never wakes
    /// the task: it finds nothing due and sleeps on.
    fn remove(&self, id: u64) {
        self.lock().entries.remove(&id);
    }

    /// After a renewal of `id` ended: records what it found and schedules the next.
    fn renewed(&self, id: u64, sent: Instant, renewed: crate::error::Result<()>) {
        let mut schedule = self.lock();
        schedule.in_flight -= 1;
        let Some(entry) = schedule.entries.get_mut(&id) else {
            return; // stopped meanwhile
        };
        let state = entry.state.clone();
        match renewed {
            Ok(()) => {
                state.renewals.fetch_add(1, Ordering::SeqCst);
                state.failing.store(false, Ordering::SeqCst);
                // The new lease counts from the statement, not its answer.
                *state.confirmed_at.lock().unwrap_or_else(|p| p.into_inner()) = sent;
            }
            Err(Error::LostClaim { .. }) => {
                state.lost.store(true, Ordering::SeqCst);
                schedule.entries.remove(&id);
                return;
            }
            Err(e) => {
                state.failures.fetch_add(1, Ordering::SeqCst);
                state.failing.store(true, Ordering::SeqCst);
                *state.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            }
        }
        entry.renewing = false;
        entry.due = Instant::now() + entry.interval;
        let due = entry.due;
        if schedule.wakes_at.is_some_and(|at| due < at) {
            drop(schedule);
            self.wake.notify_one();
        }
    }
}

/// The timer task: sleeps until the earliest due renewal (or a wake-up), then sends
/// every due renewal on a blocking thread; claims past their max run are taken off.
async fn run_timer(timer: Arc<Timer>, pool: Pool) {
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        let mut in_flight = 0;
        let wake_at = {
            let mut schedule = timer.lock();
            let mut earliest: Option<Instant> = None;
            schedule.entries.retain(|_, entry| {
                if entry.renewing {
                    return true;
                }
                if entry.due > now {
                    earliest = Some(earliest.map_or(entry.due, |e| e.min(entry.due)));
                    return true;
                }
                if now >= entry.deadline {
                    entry.state.max_run_reached.store(true, Ordering::SeqCst);
                    return false;
                }
                true
            });
            for (id, entry) in schedule.entries.iter_mut() {
                if !entry.renewing && entry.due <= now {
                    entry.renewing = true;
                    in_flight += 1;
                    due.push((
                        *id,
                        entry.job_type.clone(),
                        entry.operation_key.clone(),
                        entry.token,
                        entry.interval,
                    ));
                }
            }
            schedule.in_flight += in_flight;
            let idle = schedule.idle.unwrap_or(Duration::from_secs(60));
            let at = earliest.unwrap_or(now + idle);
            schedule.wakes_at = Some(at);
            at
        };
        for (id, job_type, key, token, interval) in due {
            let (pool, timer) = (pool.clone(), timer.clone());
            let budget = renewal_timeout(interval, pool.deadline());
            // Repeated on a fresh connection if its own turns out dead, from the pool
            // or the reserve, within one renewal timeout.
            tokio::task::spawn_blocking(move || {
                let sent = Instant::now();
                let renewed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    with_fresh_conn_within(
                        &pool,
                        &Interrupt::none(),
                        Lane::Reserve,
                        budget,
                        async |c| fenced(c, Fenced::Renew, &job_type, &key, token, None).await,
                    )
                }))
                .unwrap_or_else(|_| Err(Error::Panic("heartbeat renewal panicked".into())));
                timer.renewed(id, sent, renewed);
            });
        }
        tokio::select! {
            _ = timer.wake.notified() => {}
            _ = tokio::time::sleep_until(wake_at.into()) => {}
        }
    }
}

impl Heartbeat {
    /// Starts renewing the claim `token` every [`interval_for`]`(lease_seconds)`
    /// (counted from the end of the last renewal), for at most `max_run_seconds` in
    /// total, on the process's one `timer` (renewals go through `pool`; see
    /// `store::PoolHandle::heartbeat`). Does not block and, once the timer runs, spawns
    /// nothing.
    pub fn start(
        timer: &Arc<Timer>,
        pool: &Pool,
        job_type: String,
        operation_key: String,
        token: Uuid,
        lease_seconds: f64,
        max_run_seconds: f64,
    ) -> Heartbeat {
        let now = Instant::now();
        let state = Arc::new(HeartbeatState {
            renewals: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            max_run_reached: AtomicBool::new(false),
            last_error: Mutex::new(None),
            confirmed_at: Mutex::new(now),
            lease: Duration::from_secs_f64(clamp_seconds(lease_seconds)),
        });
        let interval = interval_for(lease_seconds);
        let timer = timer.clone();
        let id = timer.add(
            pool,
            Entry {
                job_type: job_type.into(),
                operation_key: operation_key.into(),
                token,
                interval,
                due: now + interval,
                deadline: now + Duration::from_secs_f64(clamp_seconds(max_run_seconds)),
                renewing: false,
                state: state.clone(),
            },
        );
        Heartbeat {
            timer,
            id,
            state,
            pid: pool.pid(),
        }
    }

    /// Stops renewing (a renewal already under way may still land) and reports.
    /// Idempotent.
    pub fn stop(&self) -> HeartbeatReport {
        if self.pid == std::process::id() {
            self.timer.remove(self.id);
        }
        self.report()
    }

    /// What the heartbeat saw so far.
    pub fn report(&self) -> HeartbeatReport {
        self.reader().report()
    }

    /// A reader of this heartbeat's state for another thread (a host that tells
    /// renewal failures while the body still runs); it keeps answering after the
    /// heartbeat stopped.
    pub fn reader(&self) -> HeartbeatReader {
        HeartbeatReader {
            state: self.state.clone(),
        }
    }
}

/// Reads a [`Heartbeat`]'s state ([`HeartbeatReader::report`]) without owning it.
#[derive(Debug, Clone)]
pub struct HeartbeatReader {
    state: Arc<HeartbeatState>,
}

impl HeartbeatReader {
    /// What the heartbeat saw so far (see [`HeartbeatReport`]).
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
        // In a forked child the timer task does not exist, and the schedule's lock may
        // have been held by a parent's thread at fork time: leave it alone.
        if self.pid == std::process::id() {
            self.timer.remove(self.id);
        }
    }
}
