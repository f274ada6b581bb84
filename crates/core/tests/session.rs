//! Transactional sessions against a real PostgreSQL (DATABASE_URL, as set by bin/test).

use std::time::{Duration, Instant};

use common::claim::{self, ClaimAnswer, ClaimRequest, Fenced};
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::Error;
use idempotent_job_core::pool::with_conn;
use idempotent_job_core::session::Session;
use idempotent_job_core::store::Store;
use idempotent_job_core::values::{Cell, Param};

mod common;
use common::StoreExt;
use common::{counted, find_record, prepared_on_connection, runs_of, store, store_with};

fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        job_type: "SessionTest".into(),
        operation_key: format!("{key}-{}", uuid::Uuid::new_v4()),
        delivery_id: Some("jid".into()),
        lease_seconds: 30.0,
        ..Default::default()
    }
}

#[test]
fn claim_writes_and_completion_commit_together_or_not_at_all() {
    commit_together_or_not_at_all(store_with(true, 10));
    commit_together_or_not_at_all(store_with(false, 10));
}

fn commit_together_or_not_at_all(store: Store) {
    let committed = request("commit");
    let rolled_back = request("rollback");
    let (a, b) = (committed.clone(), rolled_back.clone());
    store
        .run(|pool, i| {
            for (req, commit) in [(&a, true), (&b, false)] {
                let mut session = Session::begin(pool, i)?;
                let token = match session.claim(i, req, 5.0)?.outcome {
                    ClaimAnswer::Claimed { token, .. } => token,
                    other => panic!("{other:?}"),
                };
                let rows = session.query(
                    i,
                    "SELECT $1::int4 + 1 AS n, $2::text AS t, $3::jsonb AS j, $4::date AS d",
                    &[
                        Param::Int(41),
                        Param::Text("x".into()),
                        Param::Json(r#"{"a":1}"#.into()),
                        Param::Text("2026-11-29".into()),
                    ],
                )?;
                assert_eq!(rows[0][0], ("n".to_string(), Cell::Int(42)));
                assert_eq!(rows[0][2].1, Cell::Json(r#"{"a": 1}"#.into()));
                assert_eq!(rows[0][3].1, Cell::Date(2026, 11, 29));
                complete_in(&mut session, i, req, token)?;
                if commit {
                    session.commit(i)?;
                } else {
                    session.rollback(i)?;
                }
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    assert_eq!(find_record(&store, &committed).unwrap().status, "completed");
    assert!(find_record(&store, &rolled_back).is_none());
}

/// The error of running one job statement, `sql` with `values`, in a fresh session.
fn statement_error(sql: &str, values: &[Param]) -> Error {
    store()
        .run(|pool, i| {
            let mut session = Session::begin(pool, i)?;
            session.query(i, sql, values)
        })
        .unwrap_err()
}

#[test]
fn a_bad_bind_names_the_type_and_suggests_a_cast() {
    let err = statement_error("SELECT $1::int4", &[Param::Text("nope".into())]);
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("cannot bind a string to a parameter of type int4")),
        "{err:?}"
    );
}

#[test]
fn a_column_of_a_type_not_converted_is_the_statements_error_not_the_connections() {
    let err = statement_error("SELECT pg_sleep(0)", &[]);
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("columns of type void are not converted")
            && m.contains("SELECT pg_sleep(0)")),
        "{err:?}"
    );
    assert!(!err.retryable());
}

#[test]
fn a_concurrent_claim_waits_for_the_open_transaction_and_is_bounded() {
    waits_for_the_open_transaction(store_with(true, 10));
    waits_for_the_open_transaction(store_with(false, 10));
}

fn waits_for_the_open_transaction(store: Store) {
    let req = request("wait");
    let (first, second) = (req.clone(), req.clone());
    let outcome = store.run(|pool, i| {
        let mut holder = Session::begin(pool, i)?;
        assert!(matches!(
            holder.claim(i, &first, 5.0)?.outcome,
            ClaimAnswer::Claimed { .. }
        ));
        // While the holder's transaction is open, a second claim waits, then times out.
        let mut waiter = Session::begin(pool, i)?;
        let started = Instant::now();
        let timed_out = waiter.claim(i, &second, 0.2);
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(
            matches!(timed_out, Err(Error::LockTimeout { ref message }) if message.contains("0.2 s")),
            "{timed_out:?}"
        );
        waiter.rollback(i)?;
        // The holder rolls back: the next claim finds no record and claims.
        holder.rollback(i)?;
        let mut next = Session::begin(pool, i)?;
        let outcome = next.claim(i, &second, 5.0)?.outcome;
        next.rollback(i)?;
        Ok::<_, Error>(outcome)
    });
    assert!(matches!(outcome.unwrap(), ClaimAnswer::Claimed { .. }));
}

#[test]
fn a_transactional_claim_shares_the_connections_prepared_claim() {
    let store = store_with(true, 1);
    let (first, second) = (request("shared"), request("shared"));
    store
        .run(|pool, i| {
            let mut session = Session::begin(pool, i)?;
            session.claim(i, &first, 5.0)?;
            session.rollback(i)?;
            with_conn(pool, i, async |c| claim::claim(c, &second).await)
        })
        .unwrap();
    // One named claim statement on the pool's one connection, run by both.
    assert_eq!(
        runs_of(&prepared_on_connection(&store), claim::CLAIM_SQL),
        counted(&store, &[2])
    );
}

/// Completes `req`'s claim `token` inside `session`.
fn complete_in(
    session: &mut Session,
    i: &Interrupt<'_>,
    req: &ClaimRequest,
    token: uuid::Uuid,
) -> Result<(), Error> {
    session.fenced(
        i,
        Fenced::Complete,
        &req.job_type,
        &req.operation_key,
        token,
        None,
    )
}

/// A transactional first claim of `req` that runs `work` (one statement), completes and
/// commits.
fn run_first_claim(store: &Store, req: &ClaimRequest, work: Option<&str>) {
    let req = req.clone();
    store
        .run(|pool, i| {
            let mut session = Session::begin(pool, i)?;
            let ClaimAnswer::Claimed { token, .. } = session.claim(i, &req, 5.0)?.outcome else {
                panic!("expected a first claim");
            };
            if let Some(sql) = work {
                session.execute(i, sql, &[])?;
            }
            complete_in(&mut session, i, &req, token)?;
            session.commit(i)
        })
        .unwrap();
}

/// The record's `repeat_facts` elements, after this process's bookkeeping is written.
fn repeat_facts(store: &Store, req: &ClaimRequest) -> Vec<serde_json::Value> {
    let req = req.clone();
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    store
        .with_conn(async |c| {
            let row = c
                .query_one(
                    "SELECT repeat_facts FROM idempotent_job_records \
                     WHERE job_type = $1 AND operation_key = $2",
                    &[&req.job_type, &req.operation_key],
                )
                .await?;
            Ok(row.try_get::<_, serde_json::Value>(0)?)
        })
        .unwrap()
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_repeat_met_in_a_transaction_records_its_facts_once_the_transaction_commits() {
    let store = store();
    let mut req = request("facts");
    req.facts_json = Some(r#"{"jid":"first"}"#.into());
    // The first claim commits (its facts are the record's first_facts).
    run_first_claim(&store, &req, None);
    // Two duplicates in transactions: the rolled-back one leaves no trace.
    for (jid, commit) in [("copy", true), ("rolled-back", false)] {
        let mut copy = req.clone();
        copy.facts_json = Some(format!(r#"{{"jid":"{jid}"}}"#));
        store
            .run(|pool, i| {
                let mut session = Session::begin(pool, i)?;
                let outcome = session.claim(i, &copy, 5.0)?.outcome;
                assert!(
                    matches!(outcome, ClaimAnswer::Completed { .. }),
                    "{outcome:?}"
                );
                if commit {
                    session.commit(i)
                } else {
                    session.rollback(i)
                }
            })
            .unwrap();
    }
    let facts = repeat_facts(&store, &req);
    assert_eq!(facts.len(), 1, "{facts:?}");
    assert_eq!(facts[0]["decision"], "completed");
    assert_eq!(facts[0]["facts"]["jid"], "copy");
    let record = find_record(&store, &req).unwrap();
    assert_eq!(record.duplicates, 1, "counted once, by the claim statement");
}

#[test]
fn a_transactional_completion_is_timed_when_it_runs_not_when_the_transaction_began() {
    let store = store();
    let req = request("completed-at");
    // The job's own work takes a while.
    run_first_claim(&store, &req, Some("SELECT pg_sleep(0.2)"));
    let record = find_record(&store, &req).unwrap();
    let took = record.completed_at.unwrap() - record.first_claimed_at;
    assert!(took.num_milliseconds() >= 200, "{took:?}");
}
