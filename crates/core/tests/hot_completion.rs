//! The completion is a HOT update (migration V10): no index covers a column it
//! changes, so PostgreSQL writes the new row version beside the old one in its page
//! and no index entry at all. Counted by the server itself
//! (`pg_stat_get_xact_tuples_hot_updated`), in a schema of the test's own.

mod common;
use common::claim::{self, Fenced, PreparedResult};
use common::{drop_schema, request, store_in, StoreExt};
use uuid::Uuid;

/// Claims and finishes `n` operations one after another in one transaction (so the
/// server's per-transaction counters see them all), each finished by `finish`, and
/// returns (rows updated, of which HOT).
fn updates(schema: &str, n: usize, finish: Fenced, result: Option<&PreparedResult>) -> (i64, i64) {
    let store = store_in(schema);
    let counted = store
        .with_conn(async |c| {
            c.batch_execute("BEGIN").await?;
            for i in 0..n {
                let req = request("HotJob", &format!("op-{i}"), 30.0);
                let token = Uuid::new_v4();
                claim::claim_as(c, &req, token).await?;
                claim::fenced_with_result(c, finish, "HotJob", &req.operation_key, token, None, result)
                    .await?;
            }
            let row = c
                .query_one(
                    "SELECT pg_stat_get_xact_tuples_updated('idempotent_job_records'::regclass), \
                            pg_stat_get_xact_tuples_hot_updated('idempotent_job_records'::regclass)",
                    &[],
                )
                .await?;
            c.batch_execute("COMMIT").await?;
            Ok((row.get(0), row.get(1)))
        })
        .unwrap();
    drop_schema(schema);
    counted
}

#[test]
fn every_completion_is_a_hot_update() {
    let (updated, hot) = updates("ij_hot_complete", 300, Fenced::Complete, None);
    assert_eq!(updated, 300, "one update per completion");
    assert_eq!(hot, updated, "every completion HOT: {hot} of {updated}");
}

#[test]
fn a_completion_storing_a_result_is_a_hot_update_too() {
    let result = claim::prepare(
        65_536,
        "HotJob",
        "op",
        claim::ResultInput::Json(r#"{"receipt":"r-1","cents":1250}"#),
    );
    assert!(result.json.is_some(), "stored");
    let (updated, hot) = updates("ij_hot_result", 300, Fenced::Complete, Some(&result));
    assert_eq!(updated, 300);
    assert_eq!(hot, updated, "every completion HOT: {hot} of {updated}");
}

#[test]
fn giving_up_is_a_hot_update() {
    let (updated, hot) = updates("ij_hot_give_up", 300, Fenced::GiveUp, None);
    assert_eq!(updated, 300);
    assert_eq!(hot, updated, "every give-up HOT: {hot} of {updated}");
}
