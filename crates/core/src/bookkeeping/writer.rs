//! The queue of one process's repeats and its background writer ([`Bookkeeper`]): how a
//! batch is written, kept after a transient error, or dropped and counted.

use std::collections::btree_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::Notify;
use tokio_postgres::types::Type;

use super::batch::{batch_params, left_out, LeftOut};
use super::pending::{Key, Queue};
use super::repeat::Repeat;
use crate::conn::{Conn, Interrupt};
use crate::error::{is_transient_state, Error, Result};
use crate::pool::{backoff, checkout_live, finish_unless_lost, Lane, Pool};
use crate::sql::{FLUSH_AWAITING_SQL, FLUSH_SQL};

/// How long the background writer gathers repeats before writing them as one batch.
pub const LINGER: std::time::Duration = std::time::Duration::from_millis(5);

/// How long the repeats of an operation whose row other transactions keep locked
/// ([`FLUSH_SQL`] skips it) stay queued, sent again on later batches, before they are
/// dropped and counted ([`Bookkeeper::dropped`]): a job's transaction open that long, or
/// one left idle in a transaction.
pub const LOCKED_ROW_PATIENCE: std::time::Duration = std::time::Duration::from_secs(600);

/// How long [`Bookkeeper::settle`] keeps sending the repeats that only add a
/// `repeat_facts` entry (the claim statement counted them) while another transaction
/// holds their row: long enough for another delivery's short transaction to commit, short
/// when that transaction is the caller's own (an ActiveRecord delivery's event subscriber
/// calling `find`), which no wait can outlast. The background writer sends them later.
pub const FACTS_ONLY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Most operations with repeats queued at once. Past it (a database refusing every
/// batch for long, e.g. read-only through a long failover, while duplicates of more
/// operations arrive) a repeat of an operation not yet queued is dropped and counted
/// ([`Bookkeeper::dropped`]); repeats of queued operations are merged into theirs.
pub const MAX_QUEUED_OPERATIONS: usize = 10_000;

/// What became of one batch ([`Bookkeeper::write`]).
enum Written {
    /// Written (or nothing was queued).
    Done,
    /// Written, but for the operations whose row another transaction held: back in
    /// the queue, ahead of what was queued meanwhile, to be sent again later (those
    /// kept locked past [`LOCKED_ROW_PATIENCE`] were dropped and counted). `counted`:
    /// some of them still add to `duplicates` (not only `repeat_facts` entries).
    Skipped { counted: bool },
    /// Not written, and known not to be: no connection was had, or PostgreSQL
    /// refused it with a transient error (a deadlock, a serialization failure, a
    /// read-only server, a lock or statement timeout, out of resources) and rolled it
    /// back. Back in the queue, ahead of what was queued meanwhile.
    Requeued(Error),
    /// Dropped and counted ([`Bookkeeper::dropped`]): refused for good (e.g. no
    /// record table), or its outcome is unknown (the connection was lost, or the
    /// deadline passed, after it was sent: it may have been written, and sending it
    /// again could count it twice).
    Dropped(Error),
}

/// The queue of one process's repeats, and its background writer.
#[derive(Default)]
pub struct Bookkeeper {
    queue: Mutex<Queue>,
    /// Queued or in-flight repeats per operation, of those still to add to `duplicates`
    /// ([`Repeat::adds_duplicate`]).
    unsettled: Mutex<HashMap<Key, usize>>,
    /// Every repeat queued or in a batch being written, counted or not: [`Bookkeeper::settle`]
    /// returns at once only when it is 0 (a facts-only repeat the writer has taken from the
    /// queue is in neither `queue` nor `unsettled` until its batch is written).
    outstanding: AtomicUsize,
    /// Repeats dropped: see [`Bookkeeper::dropped`].
    dropped: AtomicU64,
    /// Held while a batch is being written.
    writing: tokio::sync::Mutex<()>,
    wake: Notify,
}

impl Bookkeeper {
    /// Queues `repeat` for the background writer (merged with the queued repeats of
    /// its operation). Dropped and counted ([`Bookkeeper::dropped`]) when
    /// [`MAX_QUEUED_OPERATIONS`] other operations are queued already.
    pub fn record(&self, repeat: Repeat) {
        let key = (repeat.job_type.clone(), repeat.operation_key.clone());
        let count = repeat.adds_duplicate();
        {
            let mut queue = lock(&self.queue);
            if queue.len() >= MAX_QUEUED_OPERATIONS && !queue.contains_key(&key) {
                self.dropped.fetch_add(1, Ordering::SeqCst);
                return;
            }
            queue.entry(key.clone()).or_default().add(repeat);
            // Counted before the queue is let go: the writer may take it at once.
            self.outstanding.fetch_add(1, Ordering::SeqCst);
            if count {
                *lock(&self.unsettled).entry(key).or_default() += 1;
            }
        }
        self.wake.notify_one();
    }

    /// Duplicates of this operation queued or being written (not yet counted in the
    /// record).
    pub fn pending(&self, job_type: &str, operation_key: &str) -> usize {
        let unsettled = lock(&self.unsettled);
        if unsettled.is_empty() {
            return 0;
        }
        unsettled
            .get(&(job_type.to_string(), operation_key.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Repeats this process dropped instead of writing them, since its pool was
    /// built: a batch PostgreSQL refused for good or whose outcome was unknown (see
    /// [`Bookkeeper::settle`]), and repeats past [`MAX_QUEUED_OPERATIONS`].
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// Writes everything queued now, on the calling thread, after any batch in
    /// flight. A batch PostgreSQL refused with a transient error (a serialization
    /// failure, a read-only server…), or that found no connection, is kept and written
    /// again after [`backoff`], within the pool's deadline; so are the operations whose
    /// row another transaction holds (a batch never waits for a row lock: see
    /// [`FLUSH_SQL`]) while some of them still add to `duplicates`. Repeats that only
    /// add a `repeat_facts` entry (the claim statement counted them: an ActiveRecord
    /// delivery's, whose transaction may be the caller's own) are sent again for
    /// [`FACTS_ONLY_PATIENCE`] at most: once only they are left past it, `settle` returns
    /// `Ok` and the background writer sends them when their row is free. Counted ones
    /// still locked when the deadline leaves no room stay queued for the background
    /// writer, and `settle` returns `Ok`.
    ///
    /// Errors: the last transient error when the deadline leaves no room (the
    /// repeats stay queued: the background writer goes on trying); a batch refused
    /// for good (e.g. SQLSTATE 42P01), or lost with its connection after it was sent,
    /// is dropped, counted ([`Bookkeeper::dropped`]) and its error returned;
    /// [`Error::Interrupted`] (the batch stays queued when it was not sent).
    pub fn settle(&self, pool: &Pool, interrupt: &Interrupt<'_>) -> Result<()> {
        if self.outstanding.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        let started = Instant::now();
        let until = started + pool.deadline();
        let facts_until = (started + FACTS_ONLY_PATIENCE).min(until);
        let _writing = pool.block_on_background(interrupt, self.writing.lock())?;
        let mut failures = 0;
        loop {
            let (last, by) = match self.write(pool, interrupt, until) {
                Written::Done => return Ok(()),
                Written::Dropped(e) => return Err(e),
                // Only `repeat_facts` entries left, of rows another transaction holds
                // (perhaps the caller's own, an ActiveRecord delivery's): the counts a
                // read needs are written; waited for a moment only.
                Written::Skipped { counted: false } => (Ok(()), facts_until),
                Written::Skipped { counted: true } => (Ok(()), until),
                Written::Requeued(e) => (Err(e), until),
            };
            failures += 1;
            let wait = backoff(failures);
            if Instant::now() + wait >= by {
                return last;
            }
            pool.pause(interrupt, wait)?;
        }
    }

    /// Waits for the batch being written, if any, then keeps any other from being
    /// written (by the background writer or [`Bookkeeper::settle`]) while the guard
    /// lives: for the pool's owner, which stops the runtime the writer runs on.
    /// Blocks the calling thread, which must not be one of a runtime.
    pub(crate) fn hold_writes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writing.blocking_lock()
    }

    /// Takes the queue and writes it as one batch, before `until`. Called with
    /// `writing` held.
    fn write(&self, pool: &Pool, interrupt: &Interrupt<'_>, until: Instant) -> Written {
        let mut batch = std::mem::take(&mut *lock(&self.queue));
        if batch.is_empty() {
            return Written::Done;
        }
        let (job_types, keys, docs) = batch_params(&batch);
        // Only a batch with entries waiting for a transaction's commit asks for it.
        let sql = if batch.values().any(|p| !p.awaiting.is_empty()) {
            FLUSH_AWAITING_SQL
        } else {
            FLUSH_SQL
        };
        let sent = checkout_live(pool, interrupt, Lane::Main, until).map(|mut pooled| {
            let result = pooled.run_until(interrupt, Some(until), async |c: &mut Conn| {
                c.query_own(
                    sql,
                    &[
                        (&job_types, Type::TEXT_ARRAY),
                        (&keys, Type::TEXT_ARRAY),
                        (&docs, Type::JSONB_ARRAY),
                    ],
                )
                .await
            });
            finish_unless_lost(pooled, &result);
            result
        });
        let (failed, left) = match sent {
            Ok(Ok(rows)) => (None, left_out(&rows)),
            // Nothing was sent, or PostgreSQL rolled the batch back: keep it.
            Err(e) => return self.requeue(batch, e),
            Ok(Err(e)) if rolled_back(&e) => return self.requeue(batch, e),
            Ok(Err(e)) => (Some(e), LeftOut::default()),
        };
        let mut kept = Queue::new();
        let mut expired = 0;
        // Entries whose transaction is still in progress wait like a locked row's
        // repeats. Those of a transaction that rolled back are let go with the written
        // ones, uncounted: the claim's counting was rolled back, so nothing the report
        // needs is lost. Those PostgreSQL cannot answer for are dropped and counted.
        for (key, (waiting, unknown)) in left.awaiting {
            let Some(pending) = batch.get_mut(&key) else {
                continue;
            };
            expired += unknown.len();
            if waiting.is_empty() {
                continue;
            }
            let since = *pending.locked_since.get_or_insert_with(Instant::now);
            if since.elapsed() < LOCKED_ROW_PATIENCE {
                let mut waits = pending.take_awaiting(&waiting);
                waits.locked_since = Some(since);
                kept.insert(key, waits);
            } else {
                expired += waiting.len();
            }
        }
        for key in left.locked {
            let Some(mut pending) = batch.remove(&key) else {
                continue;
            };
            let since = *pending.locked_since.get_or_insert_with(Instant::now);
            if since.elapsed() < LOCKED_ROW_PATIENCE {
                kept.insert(key, pending);
            } else {
                // Dropped below with the written ones (counted as dropped).
                expired += pending.repeats;
                batch.insert(key, pending);
            }
        }
        let skipped = !kept.is_empty();
        let counted = kept.values().any(|p| p.dups > 0);
        if skipped {
            self.put_back(kept);
        }
        let repeats: usize = batch.values().map(|p| p.repeats).sum();
        if failed.is_some() {
            self.dropped.fetch_add(repeats as u64, Ordering::SeqCst);
        } else {
            self.dropped.fetch_add(expired as u64, Ordering::SeqCst);
        }
        let mut unsettled = lock(&self.unsettled);
        for (key, p) in &batch {
            if let Some(n) = unsettled.get_mut(key) {
                *n = n.saturating_sub(p.dups as usize);
                if *n == 0 {
                    unsettled.remove(key);
                }
            }
        }
        self.outstanding.fetch_sub(repeats, Ordering::SeqCst);
        match failed {
            None if skipped => Written::Skipped { counted },
            None => Written::Done,
            Some(e) => Written::Dropped(e),
        }
    }

    /// Puts an unwritten batch back, ahead of the repeats queued since.
    fn requeue(&self, batch: Queue, err: Error) -> Written {
        self.put_back(batch);
        Written::Requeued(err)
    }

    /// Puts unwritten repeats back, ahead of the repeats queued since.
    fn put_back(&self, mut batch: Queue) {
        let mut queue = lock(&self.queue);
        for (key, newer) in std::mem::take(&mut *queue) {
            match batch.entry(key) {
                Entry::Occupied(mut older) => older.get_mut().absorb(newer),
                Entry::Vacant(slot) => {
                    slot.insert(newer);
                }
            }
        }
        *queue = batch;
    }

    /// The background writer: wakes on [`Bookkeeper::record`], writes what is queued
    /// (repeats queued while a batch is written go in the next one), forever. A batch
    /// kept after a transient error, or the repeats of rows another transaction held,
    /// are written again after [`backoff`] (20 ms, doubling, at most 1 s). Runs on the pool's background runtime; each
    /// batch on one of its blocking threads.
    pub async fn run(pool: Pool, this: std::sync::Arc<Bookkeeper>) {
        let mut failures = 0;
        loop {
            if failures == 0 {
                this.wake.notified().await;
                // Gather a batch: one write for all the repeats of the next few
                // milliseconds, so the bookkeeping takes a pooled connection rarely.
                tokio::time::sleep(LINGER).await;
            } else {
                tokio::time::sleep(backoff(failures)).await;
            }
            let writing = this.writing.lock().await;
            let (p, b) = (pool.clone(), this.clone());
            let written = tokio::task::spawn_blocking(move || {
                b.write(&p, &Interrupt::none(), Instant::now() + p.deadline())
            })
            .await;
            drop(writing);
            failures = match written {
                Ok(Written::Requeued(_) | Written::Skipped { .. }) => failures + 1,
                _ => 0,
            };
        }
    }
}

/// Whether PostgreSQL answered `err` and rolled the statement back with it, for a
/// reason that passes: a transient state ([`is_transient_state`]: deadlock,
/// serialization failure, read-only, out of resources), a lock timeout or a
/// statement timeout.
fn rolled_back(err: &Error) -> bool {
    err.sqlstate()
        .is_some_and(|code| is_transient_state(code) || matches!(code, "55P03" | "57014"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
