//! Named statements prepared once per connection (or not at all), a statement the
//! server forgot, asynchronous completions, replaced idle connections, the record's
//! select list and the settle of a batch.

use super::*;

#[test]
pub(crate) fn named_statements_are_prepared_once_per_connection_and_reused() {
    let store = store_with(true, 1);
    let req = request(&unique("named"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    assert!(matches!(
        claim(&store, &req).unwrap(),
        ClaimAnswer::InProgress { .. }
    ));
    complete(&store, &req, token).unwrap();
    find(&store, &req);
    let prepared = prepared_on_connection(&store);
    // The first claim and the duplicate are decided by the delivery statement (its
    // insert, then its read-only look); the claim statement is not needed.
    assert_eq!(
        runs_of(&prepared, claim::DELIVER_SQL),
        counted(&store, &[2]),
        "{prepared:?}"
    );
    assert_eq!(runs_of(&prepared, claim::CLAIM_SQL), counted(&store, &[]));
    assert_eq!(
        runs_of(&prepared, Fenced::Complete.sql()),
        counted(&store, &[1])
    );
    assert_eq!(runs_of(&prepared, claim::FIND_SQL), counted(&store, &[1]));

    // A third claim (a duplicate) reuses the same statement: nothing new is prepared.
    claim(&store, &req).unwrap();
    let again = prepared_on_connection(&store);
    assert_eq!(again.len(), prepared.len(), "{again:?}");
    assert_eq!(runs_of(&again, claim::DELIVER_SQL), counted(&store, &[3]));
}

#[test]
pub(crate) fn with_prepared_statements_off_nothing_is_prepared() {
    let store = store_with(false, 1);
    let req = request(&unique("unnamed"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    claim(&store, &req).unwrap();
    complete(&store, &req, token).unwrap();
    find(&store, &req);
    assert_eq!(prepared_on_connection(&store), vec![]);
}

#[test]
pub(crate) fn a_statement_the_server_forgot_names_the_setting_and_is_prepared_again_next_time() {
    let store = store_with(true, 1);
    let req = request(&unique("forgot"), "1", 30.0);
    claim(&store, &req).unwrap();
    // What PgBouncer in transaction mode does to a named statement: the server
    // connection that runs it is not the one that prepared it.
    store
        .with_conn(async |c| Ok(c.batch_execute("DEALLOCATE ALL").await?))
        .unwrap();
    let err = claim(&store, &req).unwrap_err();
    assert_eq!(err.sqlstate(), Some("26000"), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(
        err.to_string().contains("PgBouncer")
            && err.to_string().contains("prepared_statements: false"),
        "{err}"
    );
    // No retry loop: the failed call raised; the next one prepares afresh.
    assert!(matches!(
        claim(&store, &req).unwrap(),
        ClaimAnswer::InProgress { .. }
    ));
}

#[test]
pub(crate) fn the_gems_named_statements_are_planned_once_per_connection_generically() {
    let store = store_with(true, 1);
    for n in 0..8 {
        let req = request(&unique("plans"), &n.to_string(), 30.0);
        let (token, _, _) = token_of(claim(&store, &req).unwrap());
        claim(&store, &req).unwrap(); // a duplicate: the read-only look
        complete(&store, &req, token).unwrap();
    }
    // generic_plans and custom_plans exist from PostgreSQL 14 on (NULL here on 13).
    let plans: Vec<(String, Option<i64>, Option<i64>)> = store
        .with_conn(async |c| {
            let rows = c
                .query_typed(
                    "SELECT statement, (to_jsonb(p) ->> 'generic_plans')::int8, \
                            (to_jsonb(p) ->> 'custom_plans')::int8 \
                     FROM pg_prepared_statements p \
                     WHERE statement LIKE '%idempotent_job_records%'",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
        .unwrap();
    // Every call of the 8 first claims, 8 duplicates and 8 completions ran the one
    // generic plan of the statement prepared on the pool's connection: none was
    // planned for its parameters, and no checkout or recycle prepared it again (a
    // statement prepared again starts its counts afresh).
    for (sql, calls) in [(claim::DELIVER_SQL, 16), (Fenced::Complete.sql(), 8)] {
        let found: Vec<_> = plans.iter().filter(|(text, ..)| text == sql).collect();
        assert_eq!(found.len(), 1, "{plans:?}");
        if let (Some(generic), Some(custom)) = (found[0].1, found[0].2) {
            assert_eq!(custom, 0, "custom plans of {sql}: {plans:?}");
            assert_eq!(generic, calls, "generic plans of {sql}: {plans:?}");
        }
    }
}

#[test]
pub(crate) fn an_asynchronous_completion_completes_the_claim() {
    store(); // migrated
    let mut config = Config::new(database_url());
    config.asynchronous_completion = true;
    let store = Store::new(config).unwrap();
    let req = request(&unique("async"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    fenced(&store, &req, Fenced::CompleteAsynchronously, token).unwrap();
    // Idempotent for its own token, like the durable completion.
    fenced(&store, &req, Fenced::CompleteAsynchronously, token).unwrap();
    assert_eq!(find(&store, &req).status, "completed");
    assert!(matches!(
        fenced(
            &store,
            &req,
            Fenced::CompleteAsynchronously,
            uuid::Uuid::new_v4()
        ),
        Err(Error::LostClaim { .. })
    ));
}

#[test]
pub(crate) fn an_idle_connection_the_server_terminated_is_replaced_at_checkout() {
    store(); // migrated
    let mut config = Config::new(database_url());
    config.pool_size = 1;
    config.application_name = "terminated-idle".into();
    let victim = Store::new(config).unwrap();
    let req = request(&unique("terminated"), "1", 30.0);
    claim(&victim, &req).unwrap();
    // Another session terminates the pooled connection while it sits idle (what a
    // PostgreSQL restart or failover does); the server's message waits in its socket.
    let killed: i64 = store()
        .with_conn(async |c| {
            let rows = c
                .query_typed(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = 'terminated-idle'",
                    &[],
                )
                .await?;
            Ok(rows[0].get(0))
        })
        .unwrap();
    assert_eq!(killed, 1);
    std::thread::sleep(Duration::from_millis(100));
    // The checkout reads the termination and connects afresh: no error reaches the caller.
    assert!(matches!(
        claim(&victim, &req).unwrap(),
        ClaimAnswer::InProgress { .. }
    ));
}

#[test]
pub(crate) fn the_record_is_defined_once_its_select_list_names_every_field_of_the_struct() {
    let store = store_with(true, 1);
    let req = request(&unique("columns"), "1", 30.0);
    // Through a takeover, the claim that stores the delivery's job (issue 31), so every
    // field has a value to read.
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    fenced(&store, &req, Fenced::Expire, token).unwrap();
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    complete(&store, &req, token).unwrap();
    let record = find(&store, &req);
    // FIND_SQL's select list names each expression after its field, in the struct's
    // order, and every table column it reads is one the schema check knows.
    let names: Vec<&str> = record.fields().map(|(name, _)| name).collect();
    assert_eq!(names, claim::Record::NAMES);
    assert_eq!(claim::Record::NAMES.len(), claim::Record::COLUMNS.len());
    let mut at = 0;
    for name in claim::Record::COLUMNS {
        let found = claim::FIND_SQL[at..]
            .find(&format!(" AS {name}"))
            .unwrap_or_else(|| panic!("{name} after byte {at} of {}", claim::FIND_SQL));
        at += found + 1;
        let column = name.strip_suffix("_json").unwrap_or(name);
        let computed = ["lease_expired", "stored_job"].contains(name);
        assert!(
            computed || idempotent_job_core::schema::COLUMNS.contains(&column),
            "{name}"
        );
    }
    assert_eq!(record.status, "completed");
    assert_eq!(record.args_json.as_deref(), Some(r#"["1"]"#));
    assert!(record.stored_job);
    // The bindings' names: the column's own, or the one it is declared `as`.
    let renamed: Vec<(&str, &str)> = claim::Record::COLUMNS
        .iter()
        .zip(claim::Record::NAMES)
        .filter(|(column, name)| column != name)
        .map(|(column, name)| (*column, *name))
        .collect();
    assert_eq!(renamed, [("args_json", "args"), ("result_json", "result")]);
}

/// Holds the row lock of `req`'s record in another session for `hold`, from a thread of
/// its own (joined by the caller); returns once the lock is taken.
pub(crate) fn hold_row_lock(req: &ClaimRequest, hold: Duration) -> std::thread::JoinHandle<()> {
    let (job_type, key) = (req.job_type.clone(), req.operation_key.clone());
    let (taken, locked) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let (locker, connection) =
                tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
                    .await
                    .unwrap();
            let driver = tokio::spawn(connection);
            locker.batch_execute("BEGIN").await.unwrap();
            locker
                .execute(
                    "SELECT 1 FROM idempotent_job_records WHERE job_type = $1 \
                     AND operation_key = $2 FOR UPDATE",
                    &[&job_type, &key],
                )
                .await
                .unwrap();
            taken.send(()).unwrap();
            tokio::time::sleep(hold).await;
            locker.batch_execute("ROLLBACK").await.unwrap();
            drop(locker);
            let _ = driver.await;
        })
    });
    locked.recv().unwrap();
    handle
}

/// A repeat whose counters the claim statement already wrote (only its facts are
/// queued) is still waited for by `settle` once the background writer has taken it
/// from the queue: a report read after `settle` sees its facts.
#[test]
pub(crate) fn settle_waits_for_a_batch_the_writer_already_took() {
    let store = store();
    let req = request(&unique("settle"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    complete(&store, &req, token).unwrap();
    // A duplicate decided by the claim statement, as a transactional session makes it:
    // it counted itself; its facts are left to the bookkeeping.
    let sent = req.clone();
    let (_, repeat) = store
        .with_conn(async |c| claim::claim_noting(c, &sent, uuid::Uuid::new_v4()).await)
        .unwrap();
    // The writer's batch waits on this row lock with the repeat already out of the queue.
    let locking = hold_row_lock(&req, Duration::from_millis(600));
    store
        .run(|pool, _| {
            pool.bookkeeper().record(repeat.expect("a repeat"));
            Ok(())
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    let facts = store
        .with_conn(async |c| {
            let row = c
                .query_one(
                    "SELECT jsonb_array_length(repeat_facts) FROM idempotent_job_records \
                     WHERE job_type = $1 AND operation_key = $2",
                    &[&req.job_type, &req.operation_key],
                )
                .await?;
            Ok(row.get::<_, i32>(0))
        })
        .unwrap();
    locking.join().unwrap();
    assert_eq!(
        facts, 1,
        "settle returned before the taken batch was written"
    );
}
