//! The upgrades to V10 (the HOT completion's indexes) and V11 (no CHECK constraints) on
//! a live table: a table of the previous version with records in every state is
//! migrated while deliveries run on it; every record decides as before, and no running
//! delivery fails or runs twice. V10 changes indexes only and V11 constraints only (no
//! column, no statement text an older worker sends), so an older worker's statements
//! and a newer one's meet the same rows during a rolling deploy.

mod common;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::claim::{self, ClaimAnswer, ClaimKind, ClaimRequest, Fenced};
use common::{drop_schema, request, store_in_through, store_on, StoreExt};
use idempotent_job_core::migrate;
use idempotent_job_core::store::Store;
use uuid::Uuid;

fn claim_one(store: &Store, req: &ClaimRequest) -> ClaimAnswer {
    let req = req.clone();
    store
        .with_conn(async |c| claim::claim(c, &req).await)
        .unwrap()
        .outcome
}

fn token_of(answer: &ClaimAnswer) -> Uuid {
    match answer {
        ClaimAnswer::Claimed { token, .. } => *token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn finish(store: &Store, req: &ClaimRequest, token: Uuid, change: Fenced) {
    let (job_type, key) = (req.job_type.clone(), req.operation_key.clone());
    store
        .with_conn(async |c| claim::fenced(c, change, &job_type, &key, token, Some("boom")).await)
        .unwrap();
}

/// The first column of `sql`'s rows (a catalog query's names).
fn names(store: &Store, sql: &str) -> Vec<String> {
    store
        .with_conn(async |c| Ok(c.query(sql, &[]).await?.iter().map(|r| r.get(0)).collect()))
        .unwrap()
}

fn indexes(store: &Store) -> Vec<String> {
    names(
        store,
        "SELECT indexname::text FROM pg_indexes \
         WHERE tablename = 'idempotent_job_records' AND schemaname = current_schema() \
         ORDER BY 1",
    )
}

fn check_constraints(store: &Store) -> Vec<String> {
    names(
        store,
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = 'idempotent_job_records'::regclass AND contype = 'c' ORDER BY 1",
    )
}

/// Writes records in every state on `store`'s table, applies the migrations through
/// `last` (None: all) while four threads keep delivering (claim, complete, a
/// duplicate), checks that it applied exactly `expected`, that every running delivery
/// claimed once, and that every record written before decides as before.
fn upgrade_under_running_deliveries(
    store: &Store,
    schema: &str,
    last: Option<i32>,
    expected: &str,
) {
    // Records in every state, written on the older table.
    let t = "UpgradeJob";
    let completed = request(t, "completed", 30.0);
    let token = token_of(&claim_one(store, &completed));
    finish(store, &completed, token, Fenced::Complete);
    claim_one(store, &completed); // a repeat, counted
    let live = request(t, "live", 300.0);
    claim_one(store, &live);
    let stale = request(t, "stale", 0.05);
    claim_one(store, &stale);
    let held = request(t, "held", 30.0);
    let token = token_of(&claim_one(store, &held));
    finish(store, &held, token, Fenced::Hold);
    let given_up = request(t, "given-up", 30.0);
    let token = token_of(&claim_one(store, &given_up));
    finish(store, &given_up, token, Fenced::GiveUp);
    let released = request(t, "released", 30.0);
    let token = token_of(&claim_one(store, &released));
    finish(store, &released, token, Fenced::Release);
    std::thread::sleep(Duration::from_millis(100)); // the stale claim's lease ends

    // Deliveries keep running (claim, complete, a duplicate) while the migration runs.
    let running = Arc::new(AtomicBool::new(true));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (running, store) = (running.clone(), store_on(schema, 1));
            std::thread::spawn(move || {
                let mut done = 0;
                while running.load(Ordering::Relaxed) || done < 20 {
                    let req = request("UpgradeLoad", &format!("w{w}-{done}"), 30.0);
                    let token = token_of(&claim_one(&store, &req));
                    finish(&store, &req, token, Fenced::Complete);
                    match claim_one(&store, &req) {
                        ClaimAnswer::Completed { .. } => {}
                        other => panic!("a duplicate during the upgrade: {other:?}"),
                    }
                    done += 1;
                }
                done
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let applied = store
        .run(|pool, i| migrate::migrate_through(pool, i, last))
        .unwrap();
    assert_eq!(applied, vec![expected.to_string()]);
    std::thread::sleep(Duration::from_millis(200));
    running.store(false, Ordering::Relaxed);
    let ran: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();

    let completed_load: i64 = store
        .with_conn(async |c| {
            Ok(c.query_one(
                "SELECT count(*) FROM idempotent_job_records \
                 WHERE job_type = 'UpgradeLoad' AND status = 'completed' AND attempts = 1 AND duplicates = 1",
                &[],
            )
            .await?
            .get(0))
        })
        .unwrap();
    assert_eq!(
        completed_load as usize, ran,
        "each running delivery claimed once, completed, turned its copy away"
    );

    // Every record written on the older table decides as before.
    assert!(matches!(
        claim_one(store, &completed),
        ClaimAnswer::Completed { duplicates: 2, .. }
    ));
    assert!(matches!(
        claim_one(store, &live),
        ClaimAnswer::InProgress { .. }
    ));
    assert!(matches!(
        claim_one(store, &stale),
        ClaimAnswer::Claimed {
            kind: ClaimKind::Takeover,
            ..
        }
    ));
    assert!(matches!(claim_one(store, &held), ClaimAnswer::Held { .. }));
    assert!(matches!(
        claim_one(store, &given_up),
        ClaimAnswer::GivenUp { .. }
    ));
    assert!(matches!(
        claim_one(store, &released),
        ClaimAnswer::Claimed {
            kind: ClaimKind::Retry,
            ..
        }
    ));
    // The held operation is listed through V10's index of records ever held.
    let listed = store
        .with_conn(async |c| claim::held(c, Some(t), 10).await)
        .unwrap();
    assert_eq!(listed, vec![(t.to_string(), "held".to_string())]);
}

#[test]
fn a_v9_table_upgrades_under_running_deliveries_and_every_record_decides_as_before() {
    let schema = "ij_upgrade_v10";
    let store = store_in_through(schema, Some(9));
    assert!(indexes(&store).contains(&"idempotent_job_records_retention_idx".to_string()));
    upgrade_under_running_deliveries(&store, schema, Some(10), "V10__hot_completion");
    let now = indexes(&store);
    assert!(
        !now.contains(&"idempotent_job_records_retention_idx".to_string()),
        "{now:?}"
    );
    assert!(
        now.contains(&"idempotent_job_records_first_claimed_idx".to_string()),
        "{now:?}"
    );
    drop_schema(schema);
}

#[test]
fn a_v10_table_loses_its_check_constraints_under_running_deliveries_and_every_record_decides_as_before(
) {
    let schema = "ij_upgrade_v11";
    let store = store_in_through(schema, Some(10));
    assert_eq!(check_constraints(&store).len(), 4);
    upgrade_under_running_deliveries(&store, schema, None, "V11__no_check_constraints");
    assert_eq!(check_constraints(&store), Vec::<String>::new());
    drop_schema(schema);
}
