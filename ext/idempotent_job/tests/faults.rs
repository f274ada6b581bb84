//! Connection faults against a real PostgreSQL (DATABASE_URL): killed backends, a
//! server that accepts and never answers, a pool held by claims waiting on a row
//! lock, a table that drifted, arguments jsonb cannot hold.

use std::time::{Duration, Instant};

use idempotent_job::core::claim::{self, ClaimRequest, Fenced, Outcome};
use idempotent_job::core::config::Config;
use idempotent_job::core::error::Error;
use idempotent_job::core::schema;
use idempotent_job::core::store::{bounded, with_fresh_conn, Attempts, Lane, Pool, Store};

mod common;
use common::{database_url, find_record, store_with};

fn request(job_type: &str, key: &str) -> ClaimRequest {
    ClaimRequest {
        job_type: job_type.into(),
        operation_key: key.into(),
        jid: Some("jid".into()),
        lease_seconds: 30.0,
        args_json: Some("[1]".into()),
        ..ClaimRequest::default()
    }
}

fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4())
}

/// A claim repeated on fresh connections as the Ruby layer sends it (with
/// [`Attempts`] rather than `with_fresh_conn`, so the future can be spawned).
async fn claim_fresh(pool: &Pool, req: &ClaimRequest) -> Result<Outcome, Error> {
    let token = uuid::Uuid::new_v4();
    let mut attempts = Attempts::new(pool, Lane::Main);
    let started = attempts.started;
    let call = async {
        loop {
            let mut conn = attempts.conn().await?;
            let result = claim::claim_as(&conn, req, token).await;
            if !attempts.again(&mut conn, &result).await {
                return result;
            }
        }
    };
    bounded(pool.deadline(), started, call)
        .await
        .map(|d| d.outcome)
}

/// A plain tokio-postgres client on the test database (not pooled).
async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

#[test]
fn claims_right_after_the_backends_were_killed_all_succeed_on_fresh_connections() {
    let mut config = Config::new(database_url());
    config.application_name = unique("killed");
    config.pool_size = 10;
    let name = config.application_name.clone();
    let store = Store::new(config).unwrap();
    let job_type = unique("Killed");
    let failures = store
        .block_on(|pool| async move {
            // Fill the pool: ten connections, all idle afterwards.
            let warm = (0..10).map(|i| {
                let (pool, req) = (pool.clone(), request(&job_type, &format!("warm-{i}")));
                tokio::spawn(async move { claim_fresh(&pool, &req).await })
            });
            for task in warm.collect::<Vec<_>>() {
                task.await.unwrap().unwrap();
            }
            let killed: i64 = admin()
                .await
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = $1",
                    &[&name],
                )
                .await?
                .get(0);
            assert!(killed >= 1, "no backend of {name} to kill");
            // At once, before the pool could notice: 40 claims.
            let claims = (0..40).map(|i| {
                let (pool, req) = (pool.clone(), request(&job_type, &format!("after-{i}")));
                tokio::spawn(async move { claim_fresh(&pool, &req).await })
            });
            let mut failures = Vec::new();
            for task in claims.collect::<Vec<_>>() {
                if let Err(e) = task.await.unwrap() {
                    failures.push(e.to_string());
                }
            }
            Ok(failures)
        })
        .unwrap();
    assert!(
        failures.is_empty(),
        "{} of 40 failed: {failures:?}",
        failures.len()
    );
}

#[test]
fn a_server_that_never_answers_is_given_up_at_the_deadline() {
    // Accepts connections and never says a word: a partition after the TCP handshake.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let sockets: Vec<_> = listener.incoming().take(4).collect();
        std::thread::sleep(Duration::from_secs(5));
        drop(sockets);
    });
    let mut config = Config::new(format!("postgres://u@127.0.0.1:{port}/db?sslmode=disable"));
    config.deadline = 1.0;
    config.connect_timeout = 30.0;
    let store = Store::new(config).unwrap();
    let started = Instant::now();
    let req = request("Silent", "1");
    let err = store
        .block_on(|pool| async move { claim_fresh(&pool, &req).await })
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(err.retryable());
    assert!(err.to_string().contains("deadline"), "{err}");
    assert!(took < Duration::from_millis(1900), "took {took:?}");
    drop(held);
}

#[test]
fn a_completion_gets_a_connection_while_claims_waiting_on_a_row_lock_hold_the_pool() {
    drop(store_with(true, 1)); // migrated
    let mut config = Config::new(database_url());
    config.pool_size = 2;
    config.deadline = 3.0;
    config.checkout_timeout = 2.0;
    let store = Store::new(config).unwrap();
    let job_type = unique("Starved");
    let (done, blocked) = store
        .block_on(|pool| async move {
            let ran = request(&job_type, "ran");
            let Outcome::Claimed { token, .. } = claim_fresh(&pool, &ran).await? else {
                panic!("not claimed")
            };
            let locked = request(&job_type, "locked");
            claim_fresh(&pool, &locked).await?;
            let holder = admin().await;
            holder.batch_execute("BEGIN").await?;
            holder
                .execute(
                    "SELECT 1 FROM idempotent_job_records WHERE job_type = $1 AND \
                     operation_key = 'locked' FOR UPDATE",
                    &[&job_type],
                )
                .await?;
            // Two claims wait on the row and hold both pooled connections.
            let waiting: Vec<_> = (0..2)
                .map(|_| {
                    let (pool, req) = (pool.clone(), locked.clone());
                    tokio::spawn(async move {
                        let started = Instant::now();
                        let result = claim_fresh(&pool, &req).await;
                        (result, started.elapsed())
                    })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let started = Instant::now();
            with_fresh_conn(&pool, Lane::Reserve, async |c| {
                claim::fenced(c, Fenced::Complete, &ran.job_type, "ran", token, None).await
            })
            .await?;
            let done = started.elapsed();
            let mut blocked = Vec::new();
            for task in waiting {
                blocked.push(task.await.unwrap());
            }
            holder.batch_execute("ROLLBACK").await?;
            Ok((done, blocked))
        })
        .unwrap();
    println!("completion beside a starved pool: {done:?}; claims on the locked row: {blocked:?}");
    assert!(
        done < Duration::from_secs(1),
        "the completion waited {done:?}"
    );
    for (result, took) in blocked {
        assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
        assert!(took < Duration::from_secs(4), "a claim waited {took:?}");
    }
}

#[test]
fn a_table_that_lacks_columns_is_refused_before_the_first_claim() {
    let schema_name = format!("drift_{}", uuid::Uuid::new_v4().simple());
    let mut config = Config::new(database_url());
    config.schema = Some(schema_name.clone());
    let setup = schema_name.clone();
    Store::new(Config::new(database_url()))
        .unwrap()
        .block_on(|_| async move {
            admin()
                .await
                .batch_execute(&format!("CREATE SCHEMA {setup}"))
                .await?;
            Ok(())
        })
        .unwrap();
    let store = Store::new(config).unwrap();
    let migrate = |store: &Store| {
        store.block_on(|pool| async move {
            idempotent_job::core::migrate::migrate(
                &mut idempotent_job::core::store::Conn::checkout(&pool).await?,
            )
            .await
        })
    };
    migrate(&store).unwrap();
    let live: Vec<String> = store
        .block_on(|pool| async move {
            let conn = idempotent_job::core::store::Conn::checkout(&pool).await?;
            Ok(conn
                .query(schema::COLUMNS_SQL, &[])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
        .unwrap();
    let mut expected: Vec<&str> = schema::COLUMNS.to_vec();
    let mut live_sorted: Vec<&str> = live.iter().map(String::as_str).collect();
    expected.sort_unstable();
    live_sorted.sort_unstable();
    assert_eq!(
        live_sorted, expected,
        "schema::COLUMNS must list the migrated table"
    );

    let drop_sql =
        format!("ALTER TABLE {schema_name}.idempotent_job_records DROP COLUMN completed_at");
    store
        .block_on(|_| async move { Ok(admin().await.batch_execute(&drop_sql).await?) })
        .unwrap();
    let fresh = {
        let mut config = Config::new(database_url());
        config.schema = Some(schema_name.clone());
        Store::new(config).unwrap()
    };
    let req = request("Drifted", "1");
    let err = fresh
        .block_on(|pool| async move { claim_fresh(&pool, &req).await })
        .unwrap_err();
    assert_eq!(err.sqlstate(), Some("42703"), "{err}");
    assert!(
        err.to_string().contains("missing column completed_at"),
        "{err}"
    );
    let count = format!("SELECT count(*) FROM {schema_name}.idempotent_job_records");
    let rows: i64 = store
        .block_on(|_| async move { Ok(admin().await.query_one(&count, &[]).await?.get(0)) })
        .unwrap();
    assert_eq!(rows, 0, "nothing was claimed");
    let err = migrate(&fresh).unwrap_err();
    assert!(matches!(err, Error::Migration(_)), "{err:?}");
    assert!(err.to_string().contains("drifted"), "{err}");
    let cleanup = format!("DROP SCHEMA {schema_name} CASCADE");
    fresh
        .block_on(|_| async move { Ok(admin().await.batch_execute(&cleanup).await?) })
        .unwrap();
}

#[test]
fn arguments_with_a_nul_are_stored_and_read_back_unchanged() {
    let store = store_with(true, 2);
    let mut req = request(&unique("Nul"), "1");
    let args = r#"["a\u0000b",{"k":"\u0000"},"\\u0000 is not a NUL"]"#;
    req.args_json = Some(args.into());
    let claimed = store.block_on(|pool| {
        let req = req.clone();
        async move { claim_fresh(&pool, &req).await }
    });
    assert!(
        matches!(claimed, Ok(Outcome::Claimed { .. })),
        "{claimed:?}"
    );
    let record = find_record(&store, &req).unwrap();
    let stored: serde_json::Value = serde_json::from_str(record.args.as_deref().unwrap()).unwrap();
    assert_eq!(
        stored,
        serde_json::from_str::<serde_json::Value>(args).unwrap()
    );
    req.args_json = Some("[1]".into());
    req.operation_key = "2".into();
    assert!(find_record(&store, &req).is_none(), "no record yet");
    store
        .block_on(|pool| {
            let req = req.clone();
            async move { claim_fresh(&pool, &req).await }
        })
        .unwrap();
    assert_eq!(
        find_record(&store, &req).unwrap().args.as_deref(),
        Some("[1]")
    );
}

#[test]
fn read_only_and_other_transient_states_are_retryable() {
    let mut config = Config::new(format!(
        "{}?options=-c%20default_transaction_read_only%3Don",
        database_url()
    ));
    config.deadline = 1.0;
    let store = Store::new(config).unwrap();
    let req = request("ReadOnly", "1");
    let err = store
        .block_on(|pool| async move { claim_fresh(&pool, &req).await })
        .unwrap_err();
    assert_eq!(err.sqlstate(), Some("25006"), "{err}");
    assert!(err.retryable(), "{err:?}");
    assert!(err.to_string().contains("read-only"), "{err}");
    for (code, retryable) in [("40001", true), ("53300", true), ("23505", false)] {
        let e = Error::Database {
            message: String::new(),
            sqlstate: code.into(),
        };
        assert_eq!(e.retryable(), retryable, "{code}");
    }
}
