//! The bookkeeping of repeated deliveries, off the decision's path.
//!
//! A duplicate answered by the read-only look ([`super::claim::deliver`]) changes
//! nothing durable. What the repeats report needs about it (`duplicates`,
//! `last_duplicate_at`, `mismatches`, `repeat_times`, `job_classes`, and one
//! `repeat_facts` entry per repeat) is queued here and written by the background
//! runtime, batched, in ONE statement per batch ([`FLUSH_SQL`]) committed with
//! `synchronous_commit = off`. Repeats decided by the claim statement itself
//! (retries, takeovers, a duplicate that raced the first claim) already counted
//! themselves durably; only their `repeat_facts` entry is queued.
//!
//! What a crash can lose (telemetry only, never a decision: the decision is the
//! record's status and claim token, which only the durable claim and fenced
//! statements change):
//! * a process killed (SIGKILL, OOM) loses the repeats queued and not yet written:
//!   those decided in about the last [`LINGER`] (5 ms) plus one batch's write;
//! * a PostgreSQL crash loses the batches committed within `wal_writer_delay`
//!   (200 ms by default) before it.
//!
//! Within one process, reads see their own repeats: [`Bookkeeper::settle`] writes
//! what is queued (and waits for a batch in flight) before `find`/`repeats` read, and
//! a delivery whose operation still has a repeat queued settles first, so sequential
//! deliveries of one operation count exactly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_postgres::types::Type;

use super::claim::{ClaimKind, ClaimRequest, Decision, Outcome};
use super::error::Result;
use super::store::{with_conn, Conn, Interrupt, Pool};

/// Applies one batch of repeats: $1 job types, $2 operation keys, $3 one JSON
/// object per operation (same order): `dups` (duplicates to add), `mismatches`,
/// `last_mismatch`, `last_at` (latest duplicate's database time, or null), `times`
/// (duplicate times to append to `repeat_times`), `classes`, `facts` (entries to
/// append to `repeat_facts`). Keeps the last 20 times and facts. Each operation's
/// row is found through the primary key (arrays, so the planner expects a few rows,
/// never a scan of the table). Committed asynchronously (`synchronous_commit = off`
/// for this statement's transaction).
pub const FLUSH_SQL: &str = r#"
UPDATE idempotent_job_records AS r
   SET duplicates = r.duplicates + b.dups,
       last_duplicate_at = CASE WHEN b.dups > 0 THEN greatest(r.last_duplicate_at, b.last_at)
                                ELSE r.last_duplicate_at END,
       mismatches = r.mismatches + b.mismatches,
       last_mismatch = CASE WHEN b.dups > 0 THEN b.last_mismatch ELSE r.last_mismatch END,
       repeat_times = ARRAY(SELECT t FROM (SELECT t FROM unnest(r.repeat_times || b.times) AS t
                                            ORDER BY t DESC LIMIT 20) AS kept ORDER BY t),
       job_classes = r.job_classes || ARRAY(SELECT DISTINCT c FROM unnest(b.classes) AS c
                                             WHERE c <> ALL (r.job_classes)),
       repeat_facts = (SELECT coalesce(jsonb_agg(e ORDER BY n), '[]')
                         FROM (SELECT e, n FROM jsonb_array_elements(r.repeat_facts || b.facts)
                                        WITH ORDINALITY AS x(e, n)
                               ORDER BY n DESC LIMIT 20) AS kept),
       updated_at = greatest(r.updated_at, b.last_at)
  FROM (SELECT k.job_type, k.operation_key, d.*
          FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS k(job_type, operation_key, doc),
               jsonb_to_record(k.doc) AS d(dups int, mismatches int, last_mismatch bool,
                                           last_at timestamptz, times timestamptz[],
                                           classes text[], facts jsonb)) AS b,
       (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
 WHERE r.job_type = b.job_type AND r.operation_key = b.operation_key"#;

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
    /// This delivery's arguments differed from the claim's.
    pub mismatch: bool,
    /// Answered from a completion made with `store_result` (a replay: V7).
    pub replayed: bool,
}

impl Repeat {
    /// The repeat of `req`'s delivery, answered `decision` at the database time `at`;
    /// `count`: see [`Repeat::count`].
    pub fn new(req: &ClaimRequest, decision: &Decision, at: DateTime<Utc>, count: bool) -> Self {
        Repeat {
            job_type: req.job_type.clone(),
            operation_key: req.operation_key.clone(),
            at,
            job_class: req.job_class.clone(),
            decision: decision.outcome.name(),
            facts: req.facts_json.clone(),
            count,
            mismatch: decision.mismatch,
            replayed: matches!(
                decision.outcome,
                Outcome::Completed {
                    replay: Some(_),
                    ..
                }
            ),
        }
    }

    /// The repeat of a delivery the claim statement ([`super::claim::CLAIM_SQL`])
    /// decided (it counted itself): none for a first claim.
    pub fn after_claim(req: &ClaimRequest, decision: &Decision, at: DateTime<Utc>) -> Option<Self> {
        let first = matches!(
            decision.outcome,
            Outcome::Claimed {
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

/// The queue of one process's repeats, and its background writer.
#[derive(Default)]
pub struct Bookkeeper {
    queue: Mutex<Vec<Repeat>>,
    /// Queued or in-flight repeats per operation, of those still to count ([`Repeat::count`]).
    unsettled: Mutex<HashMap<Key, usize>>,
    /// Every repeat queued or in a batch being written, counted or not: [`Bookkeeper::settle`]
    /// returns at once only when it is 0 (a facts-only repeat the writer has taken from the
    /// queue is in neither `queue` nor `unsettled` until its batch is written).
    outstanding: AtomicUsize,
    /// Held while a batch is being written.
    writing: tokio::sync::Mutex<()>,
    wake: Notify,
}

impl Bookkeeper {
    /// Queues `repeat` for the background writer.
    pub fn record(&self, repeat: Repeat) {
        let key = (repeat.job_type.clone(), repeat.operation_key.clone());
        if repeat.count {
            *lock(&self.unsettled).entry(key).or_default() += 1;
        }
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        lock(&self.queue).push(repeat);
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

    /// Writes everything queued now, on the calling thread, after any batch in flight.
    ///
    /// Errors: connection/database errors (the batch is then lost: telemetry only).
    pub fn settle(&self, pool: &Pool, interrupt: &Interrupt<'_>) -> Result<()> {
        if self.outstanding.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        let _writing = pool.block_on_background(interrupt, self.writing.lock())?;
        self.write(pool, interrupt)
    }

    /// Takes the queue and writes it as one batch. Called with `writing` held.
    fn write(&self, pool: &Pool, interrupt: &Interrupt<'_>) -> Result<()> {
        let batch = std::mem::take(&mut *lock(&self.queue));
        if batch.is_empty() {
            return Ok(());
        }
        let (job_types, keys, docs) = batch_params(&batch);
        let written = with_conn(pool, interrupt, async |c: &mut Conn| {
            c.execute_own(
                FLUSH_SQL,
                &[
                    (&job_types, Type::TEXT_ARRAY),
                    (&keys, Type::TEXT_ARRAY),
                    (&docs, Type::JSONB_ARRAY),
                ],
            )
            .await
        });
        self.outstanding.fetch_sub(batch.len(), Ordering::SeqCst);
        let mut unsettled = lock(&self.unsettled);
        for r in batch.iter().filter(|r| r.count) {
            let key = (r.job_type.clone(), r.operation_key.clone());
            if let Some(n) = unsettled.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    unsettled.remove(&key);
                }
            }
        }
        written.map(|_| ())
    }

    /// The background writer: wakes on [`Bookkeeper::record`], writes what is queued
    /// (repeats queued while a batch is written go in the next one), forever. Runs on
    /// the pool's background runtime; each batch on one of its blocking threads.
    pub async fn run(pool: Pool) {
        let this = pool.bookkeeper().clone();
        loop {
            this.wake.notified().await;
            // Gather a batch: one write for all the repeats of the next few
            // milliseconds, so the bookkeeping takes a pooled connection rarely.
            tokio::time::sleep(LINGER).await;
            let writing = this.writing.lock().await;
            let (p, b) = (pool.clone(), this.clone());
            // A failed batch is lost (telemetry only); the next one goes on.
            let _ = tokio::task::spawn_blocking(move || b.write(&p, &Interrupt::none())).await;
            drop(writing);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The batch as [`FLUSH_SQL`]'s $1, $2, $3: one entry per operation, in queue order.
fn batch_params(batch: &[Repeat]) -> (Vec<String>, Vec<String>, Vec<Value>) {
    let mut order: Vec<Key> = Vec::new();
    let mut per: HashMap<Key, Value> = HashMap::new();
    for r in batch {
        let key = (r.job_type.clone(), r.operation_key.clone());
        let entry = per.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            json!({
                "dups": 0, "mismatches": 0, "last_mismatch": false, "last_at": null,
                "times": [], "classes": [], "facts": [],
            })
        });
        let at = r.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        if r.count {
            entry["dups"] = json!(entry["dups"].as_i64().unwrap_or(0) + 1);
            entry["mismatches"] =
                json!(entry["mismatches"].as_i64().unwrap_or(0) + i64::from(r.mismatch));
            entry["last_mismatch"] = json!(r.mismatch);
            entry["last_at"] = json!(at);
            push(&mut entry["times"], json!(at));
            if let Some(class) = &r.job_class {
                push(&mut entry["classes"], json!(class));
            }
        }
        let facts = r
            .facts
            .as_deref()
            .and_then(|f| serde_json::from_str::<Value>(f).ok())
            .unwrap_or(Value::Null);
        push(
            &mut entry["facts"],
            json!({"at": at, "job_class": r.job_class, "decision": r.decision, "facts": facts}),
        );
        if r.replayed {
            // A replay (V7): counted by the repeats report.
            if let Some(last) = entry["facts"].as_array_mut().and_then(|a| a.last_mut()) {
                last["replayed"] = json!(true);
            }
        }
    }
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for key in order {
        if let Some(doc) = per.remove(&key) {
            out.0.push(key.0);
            out.1.push(key.1);
            out.2.push(doc);
        }
    }
    out
}

fn push(array: &mut Value, value: Value) {
    if let Value::Array(a) = array {
        a.push(value);
    }
}
