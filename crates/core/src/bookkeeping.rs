//! The bookkeeping of repeated deliveries, off the decision's path.
//!
//! A duplicate answered by the read-only look ((`claim::deliver`)) changes
//! nothing durable. What the repeats report needs about it (`duplicates`,
//! `last_duplicate_at`, `mismatches`, `repeat_times`, `job_classes`, and one
//! `repeat_facts` entry per repeat) is queued here and written by the background
//! runtime, batched, in ONE statement per batch ([`FLUSH_SQL`]) committed with
//! `synchronous_commit = off`. Repeats decided by the claim statement itself
//! (retries, takeovers, a duplicate that raced the first claim) already counted
//! themselves durably; only their `repeat_facts` entry is queued.
//!
//! Concurrency: batches of many processes meet the same rows, and a job's open
//! transaction (the ActiveRecord or native transaction modes) holds its record's row
//! until it ends. A batch never waits for a row lock: [`FLUSH_SQL`] skips the rows
//! another transaction holds right now and names them; their repeats stay queued and
//! are sent again on a later batch ([`LOCKED_ROW_PATIENCE`] at most). So the writer
//! never waits on an application's transaction, and batches never deadlock. A batch
//! PostgreSQL still refuses with a transient error (a serialization failure, a
//! read-only server in a failover, a statement timeout) was rolled back and is kept
//! and written again, merged with what was queued since, never dropped.
//!
//! A repeat whose claim ran in a transaction is queued by the native call that made
//! the claim, while that transaction is still open: at its commit (the native
//! session's `Session::commit`), or when the delivery's one native
//! call ends without an error (a transaction on another driver, Ruby's ActiveRecord:
//! it commits right after). Its row is locked until the transaction ends, so the
//! batches skip it until then. In the second case the repeat carries the claim's
//! transaction id ([`Repeat::xid`]): its `repeat_facts` entry is written
//! ([`FLUSH_AWAITING_SQL`]) only once that transaction committed, and let go if it rolled
//! back after the call (a raising event subscriber, a failed `COMMIT`), since the claim's
//! counting was rolled back with it.
//!
//! What can be lost (telemetry only, never a decision: the decision is the record's
//! status and claim token, which only the durable claim and fenced statements
//! change):
//! * a process killed (SIGKILL, OOM) loses the repeats queued and not yet written:
//!   those of the batch being gathered ([`LINGER`]) and of the batch being written
//!   (measured: docs/design.md, "Repeat bookkeeping: what a crash can lose");
//! * a PostgreSQL crash loses the batches committed within `wal_writer_delay`
//!   (200 ms by default) before it;
//! * a repeat whose row stays locked by other transactions for longer than
//!   [`LOCKED_ROW_PATIENCE`] is dropped and counted ([`Bookkeeper::dropped`]);
//! * a batch whose connection is lost (or whose deadline passes) after it was sent
//!   is dropped: it may have been written, and sending it again could count it
//!   twice; so is a batch refused for good (no record table), and a repeat of a new
//!   operation while [`MAX_QUEUED_OPERATIONS`] are queued. [`Bookkeeper::dropped`]
//!   counts them.
//!
//! Within one process, reads see their own repeats: [`Bookkeeper::settle`] writes
//! what is queued (and waits for a batch in flight) before `find`/`repeats` read
//! (all but the `repeat_facts` entries of rows another transaction holds for longer than
//! [`FACTS_ONLY_PATIENCE`]), and
//! a delivery whose operation still has a repeat queued settles first, so sequential
//! deliveries of one operation count exactly.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_postgres::types::Type;

use crate::config::REPEATS_KEPT;
use crate::conn::{Conn, Interrupt};
use crate::error::{is_transient_state, Error, Result};
use crate::pool::{backoff, checkout_live, finish_unless_lost, Lane, Pool};
use crate::record::{ClaimAnswer, ClaimKind, ClaimReply, ClaimRequest};
use crate::sql::{FLUSH_AWAITING_SQL, FLUSH_SQL};

/// One repeated delivery to record.
#[derive(Debug, Clone)]
pub struct Repeat {
    pub job_type: String,
    pub operation_key: String,
    /// The database time of the decision.
    pub at: DateTime<Utc>,
    pub job_class: Option<String>,
    /// `completed`, `in_progress`, `held`, `given_up`, `refused`, `retry`, `takeover`.
    pub decision: &'static str,
    /// The door's delivery facts: a JSON object text, or none.
    pub facts: Option<String>,
    /// Counters still to add (a duplicate answered read-only); false when the claim
    /// statement already counted it.
    pub count: bool,
    /// A copy coming back ([`ClaimRequest::returning`]): counted when it first arrived,
    /// so it adds no `duplicates` or `mismatches` (its time, class and facts are still
    /// recorded).
    pub returning: bool,
    /// This delivery's arguments differed from the claim's.
    pub mismatch: bool,
    /// Answered from a completion made with `store_result` (a replay: V7).
    pub replayed: bool,
    /// The transaction that made the claim, when it was still open as the repeat was
    /// queued (Ruby's ActiveRecord mode: [`crate::sql::CLAIM_SQL`]'s `xid`, a full 64-bit
    /// transaction id): the `repeat_facts` entry is written only once that transaction
    /// committed, kept queued while it is in progress, and let go when it rolled back,
    /// since the claim's counting was rolled back with it (not counted in
    /// [`Bookkeeper::dropped`]: no count is lost; an id PostgreSQL cannot answer for is
    /// dropped and counted there) ([`FLUSH_AWAITING_SQL`]'s `awaiting`). None: written as it is (the
    /// claim committed already, or counts nothing). Only for a repeat the claim statement
    /// counted (`count` false): its counts, if any, are written without waiting.
    pub xid: Option<u64>,
}

impl Repeat {
    /// The repeat of `req`'s delivery, answered `decision` at the database time `at`;
    /// `count`: see [`Repeat::count`].
    pub fn new(req: &ClaimRequest, decision: &ClaimReply, at: DateTime<Utc>, count: bool) -> Self {
        Repeat {
            job_type: req.job_type.clone(),
            operation_key: req.operation_key.clone(),
            at,
            job_class: req.job_class.clone(),
            decision: decision.outcome.name(),
            facts: req.facts_json.clone(),
            count,
            returning: req.returning,
            mismatch: decision.mismatch,
            replayed: matches!(
                decision.outcome,
                ClaimAnswer::Completed {
                    replay: Some(_),
                    ..
                }
            ),
            xid: None,
        }
    }

    /// Whether this repeat adds one to `duplicates` (and its mismatch to
    /// `mismatches`): a repeat the claim statement did not count, on its first arrival.
    pub fn adds_duplicate(&self) -> bool {
        self.count && !self.returning
    }

    /// The repeat of a delivery the claim statement ([`crate::sql::CLAIM_SQL`])
    /// decided (it counted itself): none for a first claim.
    pub fn after_claim(
        req: &ClaimRequest,
        decision: &ClaimReply,
        at: DateTime<Utc>,
    ) -> Option<Self> {
        let first = matches!(
            decision.outcome,
            ClaimAnswer::Claimed {
                kind: ClaimKind::First,
                ..
            }
        );
        (!first).then(|| Repeat::new(req, decision, at, false))
    }
}

type Key = (String, String);

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

/// The repeats of one operation still to write, merged.
#[derive(Default)]
struct Pending {
    /// Repeats merged in (counted or not).
    repeats: usize,
    dups: i64,
    mismatches: i64,
    last_mismatch: bool,
    last_at: Option<String>,
    times: Vec<String>,
    classes: Vec<String>,
    facts: VecDeque<Value>,
    /// `repeat_facts` entries waiting for their transaction's commit ([`Repeat::xid`]):
    /// `{"xid": "<id>", "entry": {…}}`, in order ([`FLUSH_AWAITING_SQL`]'s `awaiting`).
    awaiting: VecDeque<Value>,
    /// When a batch first found the operation's row locked ([`FLUSH_SQL`] skipped it),
    /// or an awaited transaction still in progress, if one did.
    locked_since: Option<Instant>,
}

impl Pending {
    fn add(&mut self, r: Repeat) {
        let at = r.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        self.repeats += 1;
        if r.adds_duplicate() {
            self.dups += 1;
            self.mismatches += i64::from(r.mismatch);
            self.last_mismatch = r.mismatch;
            // The latest duplicate's time: RFC 3339 texts in UTC sort as text.
            self.last_at = self.last_at.take().max(Some(at.clone()));
        }
        if r.count {
            self.times.push(at.clone());
            keep_latest(&mut self.times);
            if let Some(class) = &r.job_class {
                if !self.classes.contains(class) {
                    self.classes.push(class.clone());
                }
            }
        }
        let facts = r
            .facts
            .as_deref()
            .and_then(|f| serde_json::from_str::<Value>(f).ok())
            .unwrap_or(Value::Null);
        let mut entry =
            json!({"at": at, "job_class": r.job_class, "decision": r.decision, "facts": facts});
        if r.replayed {
            // A replay (V7): counted by the repeats report.
            entry["replayed"] = json!(true);
        }
        match r.xid {
            Some(xid) => {
                self.awaiting
                    .push_back(json!({"xid": xid.to_string(), "entry": entry}));
                if self.awaiting.len() > REPEATS_KEPT {
                    self.awaiting.pop_front();
                }
            }
            None => {
                self.facts.push_back(entry);
                if self.facts.len() > REPEATS_KEPT {
                    self.facts.pop_front();
                }
            }
        }
    }

    /// Adds `newer` (queued after `self`) to `self`.
    fn absorb(&mut self, newer: Pending) {
        self.locked_since = self.locked_since.or(newer.locked_since);
        self.repeats += newer.repeats;
        self.dups += newer.dups;
        self.mismatches += newer.mismatches;
        if newer.dups > 0 {
            self.last_mismatch = newer.last_mismatch;
        }
        self.times.extend(newer.times);
        keep_latest(&mut self.times);
        self.last_at = self.last_at.take().max(newer.last_at);
        for class in newer.classes {
            if !self.classes.contains(&class) {
                self.classes.push(class);
            }
        }
        self.facts.extend(newer.facts);
        while self.facts.len() > REPEATS_KEPT {
            self.facts.pop_front();
        }
        self.awaiting.extend(newer.awaiting);
        while self.awaiting.len() > REPEATS_KEPT {
            self.awaiting.pop_front();
        }
    }

    /// Takes out the `awaiting` entries at `positions` (from 1, as [`FLUSH_AWAITING_SQL`] returns
    /// them), as a pending of their own (their repeats moved to it).
    fn take_awaiting(&mut self, positions: &[usize]) -> Pending {
        let mut taken = Pending::default();
        for &n in positions {
            if let Some(entry) = n.checked_sub(1).and_then(|i| self.awaiting.get_mut(i)) {
                taken.awaiting.push_back(entry.take());
            }
        }
        let moved = taken.awaiting.len().min(self.repeats);
        self.repeats -= moved;
        taken.repeats = moved;
        taken
    }

    /// The operation's JSON object of [`FLUSH_SQL`]'s $3.
    fn doc(&self) -> Value {
        let mut doc = json!({
            "dups": self.dups, "mismatches": self.mismatches,
            "last_mismatch": self.last_mismatch, "last_at": self.last_at,
            "times": self.times, "classes": self.classes, "facts": self.facts,
        });
        if !self.awaiting.is_empty() {
            doc["awaiting"] = json!(self.awaiting);
        }
        doc
    }
}

/// Keeps the [`REPEATS_KEPT`] latest of `times` (RFC 3339 texts in UTC with microseconds, so
/// they sort as text), in order.
fn keep_latest(times: &mut Vec<String>) {
    times.sort();
    let excess = times.len().saturating_sub(REPEATS_KEPT);
    times.drain(..excess);
}

/// Queued repeats per operation, in the one lock order of [`FLUSH_SQL`].
type Queue = BTreeMap<Key, Pending>;

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

/// What [`FLUSH_SQL`] left out of a batch.
#[derive(Default)]
struct LeftOut {
    /// The operations whose row another transaction held.
    locked: Vec<Key>,
    /// Per operation, the positions (from 1) in its `awaiting` of the entries whose
    /// transaction is still in progress, and of those PostgreSQL could not answer for
    /// (those of a transaction that rolled back are not listed).
    awaiting: BTreeMap<Key, (Vec<usize>, Vec<usize>)>,
}

/// [`FLUSH_SQL`]'s rows `(job_type, operation_key)`, or [`FLUSH_AWAITING_SQL`]'s
/// `(job_type, operation_key, awaiting, status)`.
fn left_out(rows: &[tokio_postgres::Row]) -> LeftOut {
    let mut left = LeftOut::default();
    for row in rows {
        let (Ok(job_type), Ok(operation_key)) = (row.try_get(0), row.try_get(1)) else {
            continue;
        };
        let key = (job_type, operation_key);
        match row.try_get::<_, Option<i64>>(2).ok().flatten() {
            None => left.locked.push(key),
            Some(n) => {
                let (waiting, unknown) = left.awaiting.entry(key).or_default();
                let n = usize::try_from(n).unwrap_or(0);
                match row.try_get::<_, Option<&str>>(3).ok().flatten() {
                    Some("in progress") => waiting.push(n),
                    Some("aborted") => {}
                    _ => unknown.push(n),
                }
            }
        }
    }
    left
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

/// The batch as [`FLUSH_SQL`]'s $1, $2, $3: one entry per operation, in the order of
/// `(job_type, operation_key)`.
fn batch_params(batch: &Queue) -> (Vec<String>, Vec<String>, Vec<Value>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for ((job_type, operation_key), pending) in batch {
        out.0.push(job_type.clone());
        out.1.push(operation_key.clone());
        out.2.push(pending.doc());
    }
    out
}
