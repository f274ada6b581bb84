//! The repeat bookkeeping's batches against a real PostgreSQL (DATABASE_URL): a batch
//! that skips (never waits for) a row another transaction holds and writes it later, a
//! batch PostgreSQL rolls back (a read-only server) kept and written again instead of
//! dropped, a duplicate answered by a
//! read-only server, and a closed store letting its connections go (issue 25); the
//! limits (`limits.rs`): counters at int4's maximum, facts as deep as a claim takes, a
//! `since` before PostgreSQL's first timestamp.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;
use common::claim::{self, ClaimAnswer, ClaimReply, ClaimRequest};
use idempotent_job_core::bookkeeping::Repeat;
use idempotent_job_core::config::Config;
use idempotent_job_core::error::Error;
use idempotent_job_core::migrate;
use idempotent_job_core::store::Store;

#[path = "../common/mod.rs"]
mod common;
mod limits;
use common::StoreExt;
use common::{database_url, Admin};

/// The tests look for "a batch waiting on a row lock": one at a time, so none sees
/// another's batch.
static SERIAL: Mutex<()> = Mutex::new(());

/// A migrated store whose connections are named `application_name`.
fn store_named(application_name: &str) -> Store {
    let mut config = Config::new(database_url());
    config.application_name = application_name.into();
    let store = Store::new(config).unwrap();
    store.run(|pool, i| migrate::migrate(pool, i)).unwrap();
    store
}

/// A job type (or application name) of this test alone.
fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4())
}

/// First claims of `keys` (records to count repeats in).
fn claim_all(store: &Store, job_type: &str, keys: &[&str]) {
    for key in keys {
        let req = ClaimRequest {
            job_type: job_type.into(),
            operation_key: (*key).into(),
            lease_seconds: 30.0,
            ..ClaimRequest::default()
        };
        store.run(|pool, i| claim::deliver(pool, i, &req)).unwrap();
    }
}

/// A duplicate answered by the read-only look, still to count.
fn duplicate(job_type: &str, key: &str) -> Repeat {
    Repeat {
        job_type: job_type.into(),
        operation_key: key.into(),
        at: Utc::now(),
        job_class: Some("BookkeepingJob".into()),
        decision: "completed",
        facts: None,
        count: true,
        returning: false,
        mismatch: false,
        replayed: false,
        xid: None,
    }
}

fn duplicates(admin: &Admin, job_type: &str, key: &str) -> i64 {
    admin.int(&format!(
        "SELECT duplicates::int8 FROM idempotent_job_records \
          WHERE job_type = '{job_type}' AND operation_key = '{key}'"
    ))
}

/// A session of its own holding the row lock of `(job_type, key)` in an open
/// transaction (a job's transaction that claimed it), until `COMMIT` is sent on it.
fn hold_row_lock(job_type: &str, key: &str) -> Admin {
    let admin = Admin::new();
    admin
        .try_exec(&format!(
            "BEGIN; SELECT 1 FROM idempotent_job_records \
              WHERE job_type = '{job_type}' AND operation_key = '{key}' FOR UPDATE"
        ))
        .unwrap();
    admin
}

/// Whether a bookkeeping batch of the store named `application_name` waits on a row
/// lock now (looked at from a session of its own).
fn a_batch_waits(application_name: &str) -> bool {
    Admin::new().int(&format!(
        "SELECT count(*) FROM pg_stat_activity \
          WHERE wait_event_type = 'Lock' \
            AND query LIKE '%SET duplicates = least(r.duplicates::int8 + b.dups%' \
            AND application_name = '{application_name}'"
    )) > 0
}

/// A row another open transaction holds (a job's ActiveRecord or native transaction that
/// claimed it) is skipped, not waited for: the batch writes the other rows, `settle`
/// returns while the lock is still held, and the skipped repeat is written once the
/// transaction ended. Before (FLUSH_SQL's `FOR NO KEY UPDATE` without `SKIP LOCKED`) the
/// batch waited on the lock until its deadline, lost its connection and dropped both
/// counts (`settle` returned the error).
#[test]
fn a_batch_skips_a_row_another_transaction_holds_and_writes_it_once_released() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let name = unique("skip-locked");
    let mut config = Config::new(database_url());
    config.application_name = name.clone();
    config.deadline = 2.0;
    let store = Store::new(config).unwrap();
    store.run(|pool, i| migrate::migrate(pool, i)).unwrap();
    let job_type = unique("SkipLocked");
    claim_all(&store, &job_type, &["a", "b"]);
    let other = hold_row_lock(&job_type, "a");
    let watcher = Admin::new();
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            store.run(|pool, i| {
                pool.bookkeeper().record(duplicate(&job_type, "b"));
                pool.bookkeeper().record(duplicate(&job_type, "a"));
                // No record (purged, say): nothing to write, nothing kept.
                pool.bookkeeper().record(duplicate(&job_type, "gone"));
                pool.bookkeeper().settle(pool, i)
            })
        });
        // While the batches are sent, none ever waits on "a"'s lock.
        while !writer.is_finished() {
            assert!(!a_batch_waits(&name), "a batch waited on the row lock");
            std::thread::sleep(Duration::from_millis(20));
        }
        writer.join().unwrap().unwrap();
    });
    let books = store.pool().unwrap().bookkeeper().clone();
    assert_eq!(duplicates(&watcher, &job_type, "b"), 1);
    assert_eq!(
        duplicates(&watcher, &job_type, "a"),
        0,
        "written through the lock"
    );
    assert_eq!(
        books.pending(&job_type, "a"),
        1,
        "the skipped repeat is still queued"
    );
    assert_eq!(
        books.pending(&job_type, "gone"),
        0,
        "a repeat of no record is not kept"
    );
    other.try_exec("COMMIT").unwrap();
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    assert_eq!(duplicates(&watcher, &job_type, "a"), 1);
    assert_eq!(duplicates(&watcher, &job_type, "b"), 1);
    assert_eq!(books.pending(&job_type, "a"), 0);
    assert_eq!(books.dropped(), 0);
}

/// The number of `repeat_facts` entries of `(job_type, key)`.
fn facts_entries(admin: &Admin, job_type: &str, key: &str) -> i64 {
    admin.int(&format!(
        "SELECT jsonb_array_length(repeat_facts)::int8 FROM idempotent_job_records \
          WHERE job_type = '{job_type}' AND operation_key = '{key}'"
    ))
}

/// A repeat the claim statement counted itself (an ActiveRecord delivery's, queued by its
/// native call while its transaction still holds the row) adds only a `repeat_facts`
/// entry: `settle` (run before `find`/`record`, e.g. by an event subscriber inside that
/// very transaction) waits for its row `bookkeeping::FACTS_ONLY_PATIENCE` (2 s) at most, not the
/// deadline, so neither the caller nor every other settle of the process blocked behind
/// it waits out the deadline; the background writer writes it once the row is free.
/// Before, `settle` retried it until the deadline (measured 9.3 s for the subscriber's
/// `find`, 8.8 s for an unrelated one). (`settle_waits_for_a_batch_the_writer_already_took`
/// in claim_protocol checks the other side: a short lock is still waited for.)
#[test]
fn settle_does_not_wait_for_a_facts_only_repeat_of_a_locked_row() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut config = Config::new(database_url());
    config.deadline = 20.0;
    let store = Store::new(config).unwrap();
    store.run(|pool, i| migrate::migrate(pool, i)).unwrap();
    let job_type = unique("FactsOnly");
    claim_all(&store, &job_type, &["a"]);
    let holder = hold_row_lock(&job_type, "a");
    let counted_by_claim = Repeat {
        count: false,
        decision: "takeover",
        ..duplicate(&job_type, "a")
    };
    let started = Instant::now();
    store
        .run(|pool, i| {
            pool.bookkeeper().record(counted_by_claim.clone());
            pool.bookkeeper().settle(pool, i)
        })
        .unwrap();
    let waited = started.elapsed();
    let watcher = Admin::new();
    assert_eq!(
        facts_entries(&watcher, &job_type, "a"),
        0,
        "written through the lock"
    );
    holder.try_exec("COMMIT").unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "settle waited {waited:?} for a row the caller may hold itself (deadline 20 s, patience 2 s)"
    );
    let until = Instant::now() + Duration::from_secs(10);
    while facts_entries(&watcher, &job_type, "a") == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        facts_entries(&watcher, &job_type, "a"),
        1,
        "written once the row was free"
    );
    assert_eq!(
        duplicates(&watcher, &job_type, "a"),
        0,
        "a facts-only repeat adds no count"
    );
}

/// A repeat the claim statement counted inside `xid`'s transaction (an ActiveRecord
/// delivery's, queued before ActiveRecord commits): only its `repeat_facts` entry is left,
/// and it waits for that commit.
fn awaiting(job_type: &str, key: &str, xid: u64) -> Repeat {
    Repeat {
        count: false,
        xid: Some(xid),
        ..duplicate(job_type, key)
    }
}

/// A session of its own in an open transaction that has a transaction id (and holds no
/// lock on any record), and that id.
fn open_transaction() -> (Admin, u64) {
    let admin = Admin::new();
    admin.exec("BEGIN");
    let xid = admin.text("SELECT pg_current_xact_id()::text");
    (admin, xid.parse().unwrap())
}

/// An entry awaiting a transaction (`Repeat::xid`) is written only once that transaction
/// committed: kept queued while it is in progress (`settle` returns after
/// `FACTS_ONLY_PATIENCE`, as for a locked row, and nothing is written), let go when it
/// rolled back (not counted in `dropped`: no count was lost). Here the transactions hold no lock on the row, so only the
/// transaction's status (FLUSH_SQL's `pg_xact_status`) keeps the entry back. Before the
/// fix (no `xid`) both entries were written at the first settle (seen: 2 entries, 0
/// dropped).
#[test]
fn an_awaited_entry_is_written_after_its_commit_and_let_go_after_its_rollback() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let store = store_named(&unique("awaiting"));
    let job_type = unique("Awaiting");
    claim_all(&store, &job_type, &["a"]);
    let books = store.pool().unwrap().bookkeeper().clone();
    let dropped = books.dropped();
    let (committing, committed_xid) = open_transaction();
    let (rolling_back, aborted_xid) = open_transaction();
    store
        .run(|pool, i| {
            pool.bookkeeper()
                .record(awaiting(&job_type, "a", committed_xid));
            pool.bookkeeper()
                .record(awaiting(&job_type, "a", aborted_xid));
            pool.bookkeeper().settle(pool, i)
        })
        .unwrap();
    let watcher = Admin::new();
    assert_eq!(
        facts_entries(&watcher, &job_type, "a"),
        0,
        "written while its transaction is in progress"
    );
    assert_eq!(books.dropped(), dropped, "dropped while in progress");
    committing.exec("COMMIT");
    rolling_back.exec("ROLLBACK");
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    assert_eq!(
        facts_entries(&watcher, &job_type, "a"),
        1,
        "the committed transaction's entry is written, the rolled back one's not"
    );
    assert_eq!(
        books.dropped(),
        dropped,
        "the rolled back one is let go, not counted as a lost count"
    );
    assert_eq!(duplicates(&watcher, &job_type, "a"), 0);
}

/// The real case: a duplicate claimed by the claim statement inside another driver's
/// transaction (as ActiveRecord mode does), its entry queued with the statement's `xid`
/// before that transaction ends. While it is open the batches skip the row; after a
/// rollback (the claim's counting undone) the entry is dropped, after a commit written.
/// Before the fix (no `xid`) the rolled-back claim's entry was written (seen: 1 entry).
#[test]
fn a_claim_rolled_back_after_its_entry_was_queued_leaves_no_entry() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let store = store_named(&unique("claim-rollback"));
    let job_type = unique("ClaimRollback");
    claim_all(&store, &job_type, &["a"]);
    let books = store.pool().unwrap().bookkeeper().clone();
    let watcher = Admin::new();
    for (end, entries, dups) in [("ROLLBACK", 0, 0), ("COMMIT", 1, 1)] {
        let dropped = books.dropped();
        let driver = Admin::new();
        driver.exec("BEGIN");
        let token = uuid::Uuid::new_v4();
        let (key, jid, lease, no_text, class, no_flag) = (
            "a",
            "jid-2",
            30.0f64,
            None::<String>,
            Some("BookkeepingJob"),
            false,
        );
        let no_facts = None::<serde_json::Value>;
        let rows = driver.query(
            claim::CLAIM_SQL,
            &[
                &job_type, &key, &token, &jid, &lease, &no_text, &class, &no_facts, &no_text,
                &no_text, &no_flag, &no_flag,
            ],
        );
        let xid: String = rows[0].get("xid");
        store
            .run(|pool, i| {
                pool.bookkeeper()
                    .record(awaiting(&job_type, key, xid.parse().unwrap()));
                pool.bookkeeper().settle(pool, i)
            })
            .unwrap();
        assert_eq!(facts_entries(&watcher, &job_type, key), 0, "before {end}");
        driver.exec(end);
        store
            .run(|pool, i| pool.bookkeeper().settle(pool, i))
            .unwrap();
        assert_eq!(
            facts_entries(&watcher, &job_type, key),
            entries,
            "after {end}"
        );
        assert_eq!(duplicates(&watcher, &job_type, key), dups, "after {end}");
        assert_eq!(books.dropped(), dropped, "after {end}");
    }
}

/// A repeat of `key` at `at` by `job_class`, with the delivery facts `{"n": n}`.
fn repeat_at(
    job_type: &str,
    key: &str,
    at: chrono::DateTime<Utc>,
    job_class: &str,
    n: u32,
) -> Repeat {
    Repeat {
        at,
        job_class: Some(job_class.into()),
        facts: Some(format!("{{\"n\": {n}}}")),
        ..duplicate(job_type, key)
    }
}

#[test]
fn batches_keep_the_latest_repeat_times_in_order_and_the_latest_facts_whatever_order_they_arrive_in(
) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let store = store_named(&unique("latest-repeats"));
    let job_type = unique("LatestRepeats");
    claim_all(&store, &job_type, &["a"]);
    let start = Utc::now();
    let at = |s: i64| start + chrono::Duration::seconds(s);
    // A first batch: 15 repeats at even seconds (facts 0..14); then a batch whose times
    // fall between them (another process's, written after): odd seconds (facts 100..109),
    // by a second class.
    let first: Vec<_> = (0..15)
        .map(|k| repeat_at(&job_type, "a", at(2 * k), "BookkeepingJob", k as u32))
        .collect();
    let second: Vec<_> = (0..10)
        .map(|k| repeat_at(&job_type, "a", at(2 * k + 1), "OtherJob", 100 + k as u32))
        .collect();
    for batch in [first, second] {
        store
            .run(|pool, i| {
                for r in batch.clone() {
                    pool.bookkeeper().record(r);
                }
                pool.bookkeeper().settle(pool, i)
            })
            .unwrap();
    }
    let admin = Admin::new();
    let row = |expr: &str| {
        admin.text(&format!(
            "SELECT ({expr})::text FROM idempotent_job_records \
              WHERE job_type = '{job_type}' AND operation_key = 'a'"
        ))
    };
    assert_eq!(duplicates(&admin, &job_type, "a"), 25);
    // The 20 latest of the 25 times (seconds 5..20, then 22..28 even), in time order.
    let times = row(
        "(SELECT string_agg(round(extract(epoch FROM t - $$START$$::timestamptz))::text, ',' \
                 ORDER BY n) FROM unnest(repeat_times) WITH ORDINALITY AS x(t, n))"
            .replace("START", &start.to_rfc3339())
            .as_str(),
    );
    let mut all: Vec<i64> = (0..15)
        .map(|k| 2 * k)
        .chain((0..10).map(|k| 2 * k + 1))
        .collect();
    all.sort();
    let expected: Vec<String> = all[5..].iter().map(|s| s.to_string()).collect();
    assert_eq!(times, expected.join(","));
    // The 20 latest facts in arrival order: the first batch's last 10, then the second's.
    let facts = row("(SELECT string_agg(e -> 'facts' ->> 'n', ',' ORDER BY n) \
            FROM jsonb_array_elements(repeat_facts) WITH ORDINALITY AS x(e, n))");
    let expected: Vec<String> = (5..15).chain(100..110).map(|n| n.to_string()).collect();
    assert_eq!(facts, expected.join(","));
    assert_eq!(row("job_classes"), "{BookkeepingJob,OtherJob}");
}

/// Claims and completes `req`'s operation through `store` (a completed record for a
/// duplicate to meet).
fn completed(store: &Store, req: &ClaimRequest) {
    let ClaimAnswer::Claimed { token, .. } = store
        .run(|pool, i| claim::deliver(pool, i, req))
        .unwrap()
        .outcome
    else {
        panic!("not claimed")
    };
    store
        .with_conn(async |c| claim::complete(c, &req.job_type, &req.operation_key, token).await)
        .unwrap();
}

/// A store whose every transaction is read-only (SQLSTATE 25006 for a write, as on a
/// standby during a failover), with a 1 s deadline.
fn read_only_store() -> Store {
    let mut config = Config::new(format!(
        "{}?options=-c%20default_transaction_read_only%3Don",
        database_url()
    ));
    config.deadline = 1.0;
    Store::new(config).unwrap()
}

#[test]
fn a_duplicate_of_a_completed_operation_is_answered_by_a_read_only_server_and_its_count_kept() {
    let writable = store_named(&unique("writable"));
    let job_type = unique("ReadOnly");
    let req = |key: &str| ClaimRequest {
        job_type: job_type.clone(),
        operation_key: key.into(),
        lease_seconds: 30.0,
        ..ClaimRequest::default()
    };
    let done = req("done");
    completed(&writable, &done);
    let read_only = read_only_store();
    let answer = read_only.run(|pool, i| claim::deliver(pool, i, &done));
    assert!(
        matches!(
            answer,
            Ok(ClaimReply {
                outcome: ClaimAnswer::Completed { duplicates: 1, .. },
                ..
            })
        ),
        "{answer:?}"
    );
    // A first claim needs a write: refused, as before.
    let first = read_only.run(|pool, i| claim::deliver(pool, i, &req("new")));
    assert_eq!(first.unwrap_err().sqlstate(), Some("25006"));
    // The count cannot be written here; it stays queued, never dropped. settle answers
    // the last error met within the store's 1 s deadline: the server's refusal (25006),
    // or, on a loaded machine where the background writer held the batch (retrying it
    // too) for most of that second, the deadline's own time-out. Either way nothing is
    // dropped, which is what the assertions below check.
    let settled = read_only
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap_err();
    assert!(
        settled.sqlstate() == Some("25006") || matches!(settled, Error::Timeout { .. }),
        "{settled:?}"
    );
    let books = read_only.pool().unwrap().bookkeeper().clone();
    assert_eq!(books.pending(&job_type, "done"), 1);
    assert_eq!(books.dropped(), 0);
}

#[test]
fn a_closed_store_lets_its_connections_go_once_its_calls_are_done() {
    let name = unique("closed");
    let store = store_named(&name);
    let job_type = unique("Closed");
    claim_all(&store, &job_type, &["a", "b"]);
    let admin = Admin::new();
    let backends = || {
        admin.int(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'"
        ))
    };
    assert!(backends() > 0);
    let pool = store.pool().unwrap(); // a call still in flight holds its pool
    store.close();
    std::thread::sleep(Duration::from_millis(200));
    assert!(backends() > 0, "closed while a call still held the pool");
    drop(pool);
    let until = Instant::now() + Duration::from_secs(20);
    while backends() > 0 {
        assert!(
            Instant::now() < until,
            "the closed store's connections stayed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
