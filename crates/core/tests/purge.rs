//! Retention: `claim::purge_batch` against a real PostgreSQL. Each test has a schema of
//! its own (`Config::schema`), so its table, rows and statistics are its alone.

mod common;
use common::{drop_schema, store_in, StoreExt};

use common::claim;
use idempotent_job_core::store::Store;

fn exec(store: &Store, sql: &str) {
    store
        .with_conn(async |c| Ok(c.batch_execute(sql).await?))
        .unwrap();
}

/// `n` records of job type `job_type`: status `status`, first claimed `ago` ago (a
/// PostgreSQL interval) and, when completed or given up, finished then too.
fn records(store: &Store, job_type: &str, n: i32, status: &str, ago: &str) {
    exec(
        store,
        &format!(
            "INSERT INTO idempotent_job_records
               (job_type, operation_key, status, claim_token, lease_seconds, lease_expires_at,
                first_claimed_at, claimed_at, completed_at, given_up_at, held_at)
             SELECT '{job_type}', '{status}-{ago}-' || i, '{status}', gen_random_uuid(), 30,
                    now(), now() - interval '{ago}', now() - interval '{ago}',
                    CASE WHEN '{status}' = 'completed' THEN now() - interval '{ago}' END,
                    CASE WHEN '{status}' = 'given_up' THEN now() - interval '{ago}' END,
                    CASE WHEN '{status}' = 'held' THEN now() - interval '{ago}' END
               FROM generate_series(1, {n}) AS i"
        ),
    );
}

fn count(store: &Store, condition: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM idempotent_job_records WHERE {condition}");
    store
        .with_conn(async |c| Ok(c.query_one(sql.as_str(), &[]).await?.get(0)))
        .unwrap()
}

#[test]
fn purge_deletes_only_old_finished_records_in_batches_and_skips_locked_ones() {
    let store = store_in("ij_purge_rows");
    records(&store, "P", 30, "completed", "2 days");
    records(&store, "P", 20, "given_up", "2 days");
    records(&store, "P", 10, "completed", "1 minute");
    records(&store, "P", 10, "held", "2 days");
    records(&store, "P", 10, "claimed", "2 days");
    records(&store, "P", 10, "released", "2 days");

    // One old completed record is locked by a claim in progress elsewhere.
    let locker = common::store();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        locker
            .with_conn(async |c| {
                c.batch_execute(
                    "BEGIN; SELECT 1 FROM ij_purge_rows.idempotent_job_records \
                     WHERE operation_key = 'completed-2 days-1' FOR UPDATE",
                )
                .await?;
                locked_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                c.batch_execute("ROLLBACK").await?;
                Ok(())
            })
            .unwrap();
    });
    locked_rx.recv().unwrap();

    // One purge: each batch starts after the last record the previous one took.
    let mut cursor = claim::PurgeCursor::default();
    let mut batch = |n: i64| {
        let done = store
            .with_conn(async |c| claim::purge_batch(c, 3600.0, n, &cursor).await)
            .unwrap();
        cursor = done.next.clone();
        (done.deleted, done.picked)
    };
    let started = std::time::Instant::now();
    assert_eq!(batch(20), (20, 20), "a full batch");
    assert_eq!(batch(20), (20, 20), "a full batch");
    assert_eq!(
        batch(20),
        (9, 9),
        "the rest, but the locked record: the purge is done"
    );
    assert_eq!(batch(20), (0, 0), "nothing left after the cursor");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "a locked record is skipped, never waited for"
    );
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    let next_purge = store
        .with_conn(async |c| {
            claim::purge_batch(c, 3600.0, 20, &claim::PurgeCursor::default()).await
        })
        .unwrap();
    assert_eq!(
        next_purge.deleted, 1,
        "the next purge takes the record once its lock is gone"
    );

    assert_eq!(
        count(&store, "status = 'completed'"),
        10,
        "recent ones stay"
    );
    assert_eq!(count(&store, "status = 'given_up'"), 0);
    assert_eq!(
        count(&store, "status IN ('held', 'claimed', 'released')"),
        30,
        "held records and live or stale claims are never purged"
    );
    drop_schema("ij_purge_rows");
}

#[test]
fn a_record_updated_after_the_batch_began_is_still_deleted() {
    let store = store_in("ij_purge_race");
    records(&store, "R", 3, "completed", "2 days");
    // A stand-in for make_interval that first waits 1 s: the batch has taken its snapshot
    // and has not locked its rows yet. Found first through the search_path below.
    exec(
        &store,
        "CREATE FUNCTION ij_purge_race.make_interval(secs float8) RETURNS interval \
         LANGUAGE plpgsql STABLE AS $$ BEGIN PERFORM pg_sleep(1); \
         RETURN pg_catalog.make_interval(secs => secs); END $$",
    );
    let purger = std::thread::spawn(move || {
        store
            .with_conn(async |c| {
                c.batch_execute("SET search_path = ij_purge_race, pg_catalog")
                    .await?;
                claim::purge_batch(c, 3600.0, 10, &claim::PurgeCursor::default()).await
            })
            .unwrap()
    });
    std::thread::sleep(std::time::Duration::from_millis(400));
    // What a duplicate delivery of a completed operation does meanwhile: the record
    // stays completed and old, in a new row version.
    let other = common::store();
    other
        .with_conn(async |c| {
            Ok(c.batch_execute(
                "UPDATE ij_purge_race.idempotent_job_records SET duplicates = duplicates + 1 \
                 WHERE operation_key = 'completed-2 days-2'",
            )
            .await?)
        })
        .unwrap();
    let done = purger.join().unwrap();
    assert_eq!(
        (done.deleted, done.picked),
        (3, 3),
        "the updated record went too"
    );
    drop_schema("ij_purge_race");
}

/// Index entries the purge's index (`first_claimed_at`, V10) has returned to this connection's scans and not
/// yet reported (the pending part of `pg_stat_user_indexes.idx_tup_read`; none is
/// reported inside a transaction, so two reads in one give what happened between).
async fn index_entries_read(c: &tokio_postgres::Client) -> i64 {
    c.query_one(
        "SELECT pg_stat_get_xact_tuples_returned('idempotent_job_records_first_claimed_idx'::regclass)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[test]
fn each_batch_starts_where_the_last_one_ended_and_reads_no_dead_index_entries() {
    let store = store_in("ij_purge_keyset");
    // Many records finished in the same instant (a bulk load, one transaction's
    // completions): the key, not the time alone, orders them.
    records(&store, "K", 6_000, "completed", "2 days");
    records(&store, "K", 100, "held", "2 days");
    records(&store, "K", 100, "claimed", "2 days");
    records(&store, "K", 100, "completed", "1 minute");

    // A long read elsewhere (a report, a backup) keeps an old snapshot: the records
    // each batch deletes stay in the index as dead entries until it ends.
    let reader = common::store();
    let (reading_tx, reading_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        reader
            .with_conn(async |c| {
                c.batch_execute(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ; \
                     SELECT count(*) FROM ij_purge_keyset.idempotent_job_records",
                )
                .await?;
                reading_tx.send(()).unwrap();
                done_rx.recv().unwrap();
                c.batch_execute("COMMIT").await?;
                Ok(())
            })
            .unwrap();
    });
    reading_rx.recv().unwrap();

    let mut cursor = claim::PurgeCursor::default();
    let mut read_per_batch = Vec::new();
    let mut total = 0;
    loop {
        let (done, read) = store
            .with_conn(async |c| {
                c.batch_execute("BEGIN").await?;
                let before = index_entries_read(c).await;
                let done = claim::purge_batch(c, 3600.0, 500, &cursor).await?;
                let read = index_entries_read(c).await - before;
                c.batch_execute("COMMIT").await?;
                Ok((done, read))
            })
            .unwrap();
        total += done.deleted;
        read_per_batch.push(read);
        cursor = done.next;
        if done.picked < 500 {
            break;
        }
    }
    done_tx.send(()).unwrap();
    holder.join().unwrap();

    assert_eq!(total, 6_000, "every due record went");
    assert_eq!(read_per_batch.len(), 13, "12 full batches and an empty one");
    // A batch that started from the beginning would read the dead entries of every
    // record deleted before it: 500, 1000, 1500 … 6000.
    assert!(
        read_per_batch.iter().all(|&read| read <= 501),
        "each batch reads its own records' entries (and one past them), never earlier \
         batches' dead ones: {read_per_batch:?}"
    );
    assert_eq!(count(&store, "status IN ('held', 'claimed')"), 200);
    assert_eq!(
        count(&store, "status = 'completed'"),
        100,
        "recent ones stay"
    );
    drop_schema("ij_purge_keyset");
}

#[test]
fn purge_probes_the_primary_key_whatever_the_statistics_say() {
    let store = store_in("ij_purge_plan");
    // Statistics that expect a large batch: many due records, analyzed. A batch
    // joined on a subquery was then hashed against a scan of the whole table, once
    // per batch (the purge's time grew with the square of the table).
    records(&store, "Q", 30_000, "completed", "2 days");
    records(&store, "Q", 10_000, "claimed", "2 days");
    exec(&store, "ANALYZE idempotent_job_records");
    let plan: Vec<String> = store
        .with_conn(async |c| {
            c.batch_execute(&format!(
                "SET search_path = ij_purge_plan; SET plan_cache_mode = force_generic_plan; {}; \
                 PREPARE purge_plan(float8, int8, timestamptz, text, text) AS {}",
                idempotent_job_core::sql::PURGE_PLAN_SQL,
                claim::PURGE_SQL
            ))
            .await?;
            let rows = c
                .query(
                    "EXPLAIN EXECUTE purge_plan(3600, 5000, NULL, NULL, NULL)",
                    &[],
                )
                .await?;
            c.batch_execute("DEALLOCATE purge_plan").await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .unwrap();
    let plan = plan.join("\n");
    assert!(
        !plan.contains("Seq Scan"),
        "no batch scans the whole table:\n{plan}"
    );
    // Sorting priced out lifts the estimate past jit_above_cost: compiling the batch
    // took ≈260 ms of every 50-record batch (bin/stress's purge stalled).
    assert!(!plan.contains("JIT"), "no batch is JIT-compiled:\n{plan}");
    assert!(
        plan.contains("Index Scan using idempotent_job_records_pkey"),
        "the batch's records are found by primary key:\n{plan}"
    );
    assert!(
        plan.contains("idempotent_job_records_first_claimed_idx"),
        "picked by the first_claimed_at index:\n{plan}"
    );
    drop_schema("ij_purge_plan");
}

/// The connection's `enable_sort` and `jit`.
async fn plan_settings(c: &tokio_postgres::Client) -> (String, String) {
    let row = c
        .query_one(
            "SELECT current_setting('enable_sort'), current_setting('jit')",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn a_batch_leaves_the_connections_plan_settings_as_they_were_even_when_it_fails() {
    let store = store_in("ij_purge_settings");
    records(&store, "S", 30, "completed", "2 days");
    let (after_batch, after_failure, deleted) = store
        .with_conn(async |c| {
            c.batch_execute("SET jit = on").await?;
            let done = claim::purge_batch(c, 3600.0, 50, &claim::PurgeCursor::default()).await?;
            let after_batch = plan_settings(c).await;
            // A batch the server refuses (a read-only session: its DELETE fails, the
            // plan settings are still allowed): the reset still runs.
            c.batch_execute("SET default_transaction_read_only = on")
                .await?;
            let failed = claim::purge_batch(c, 0.0, 50, &claim::PurgeCursor::default()).await;
            c.batch_execute("RESET default_transaction_read_only")
                .await?;
            let after_failure = plan_settings(c).await;
            Ok((after_batch, (failed.is_err(), after_failure), done.deleted))
        })
        .unwrap();
    assert_eq!(deleted, 30);
    let on = ("on".to_string(), "on".to_string());
    assert_eq!(after_batch, on, "the batch's plan settings were reset");
    assert!(after_failure.0, "the read-only batch failed");
    assert_eq!(after_failure.1, on, "reset after a failed batch too");
    drop_schema("ij_purge_settings");
}

/// A job type or operation key holding U+0000 given to the operations (record, held,
/// resolve, repeats): refused as the caller's error naming it, never sent (PostgreSQL
/// answered SQLSTATE 22021 'invalid byte sequence for encoding "UTF8": 0x00', a
/// DatabaseError naming nothing, which a door sends back as an outage).
#[test]
fn a_nul_in_an_operations_job_type_or_key_is_the_callers_error_naming_it() {
    use idempotent_job_core::conn::Interrupt;
    use idempotent_job_core::operations;
    use idempotent_job_core::records::Resolution;
    let store = common::store();
    let pool = store.pool().unwrap();
    let i = Interrupt::none();
    let since = chrono::Utc::now() - chrono::Duration::hours(1);
    let errors = [
        operations::find(&pool, &i, "A\0B", "k").map(|_| ()),
        operations::find(&pool, &i, "A", "k\0").map(|_| ()),
        operations::held(&pool, &i, Some("A\0B"), 10).map(|_| ()),
        operations::resolve(&pool, &i, "A\0B", "k", Resolution::Done).map(|_| ()),
        operations::resolve_stored(&pool, &i, "A", "k\0", Resolution::Rerun).map(|_| ()),
        operations::repeats(&pool, &i, since, Some("A\0B")).map(|_| ()),
    ];
    for (n, result) in errors.into_iter().enumerate() {
        let error = result.unwrap_err();
        let text = error.to_string();
        assert_eq!(error.class_name(), "ConfigurationError", "{n}: {text}");
        assert!(
            text.contains("NUL") && text.contains(r#"\0"#),
            "{n}: {text}"
        );
    }
}
