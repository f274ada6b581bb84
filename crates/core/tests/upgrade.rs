//! The upgrades to V10 (the HOT completion's indexes) and V11 (no CHECK constraints) on
//! a live table: a table of the previous version with records in every state is
//! migrated while deliveries run on it; every record decides as before, and no running
//! delivery fails or runs twice. V10 changes indexes only and V11 constraints only (no
//! column, no statement text an older worker sends), so an older worker's statements
//! and a newer one's meet the same rows during a rolling deploy. Since the stored job is
//! written by a takeover only (no migration), a V11 worker's statements and this
//! version's meet the same rows: [`old_and_new_workers_side_by_side_decide_every_record_and_rerun_its_stored_job`].

mod common;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::claim::{self, ClaimAnswer, ClaimKind, ClaimRequest, Fenced, Resolution};
use common::{drop_schema, request, store_in_through, store_on, StoreExt};
use idempotent_job_core::migrate;
use idempotent_job_core::store::Store;
use tokio_postgres::types::{ToSql, Type};
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

// The V11 worker's statements (this change's parent, d4b7f1c^), as an older worker sends
// them beside newer ones during a rolling deploy: its claim statement stores the job
// (job class, queue, arguments) at every first claim and every take.
const V11_CLAIM_SQL: &str = r#"
INSERT INTO idempotent_job_records AS r
    (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at,
     args_digest, job_class, queue, args, job_classes, first_facts)
VALUES ($1, $2, 'claimed', $3, $4, $5, now() + make_interval(secs => $5),
        $6, $7, $8,
        CASE WHEN strpos($9, '\u0000') > 0 THEN jsonb_build_object('idempotent_job:json', $9)
             ELSE $9::jsonb END,
        array_remove(ARRAY[$7], NULL), $11::jsonb)
ON CONFLICT (job_type, operation_key) DO UPDATE SET
    (status, claim_token, jid, attempts, takeovers, last_claim, claimed_at,
     lease_seconds, lease_expires_at, args_digest, job_class, queue, args,
     duplicates, last_duplicate_at, mismatches, last_mismatch, repeat_times, job_classes,
     updated_at) =
    (SELECT CASE WHEN d.take THEN 'claimed' ELSE r.status END,
            CASE WHEN d.take THEN excluded.claim_token ELSE r.claim_token END,
            CASE WHEN d.take THEN excluded.jid ELSE r.jid END,
            r.attempts + d.take::int,
            r.takeovers + (d.take AND r.status = 'claimed')::int,
            CASE WHEN NOT d.take THEN r.last_claim
                 WHEN r.status = 'claimed' THEN 'takeover'
                 ELSE 'retry' END,
            CASE WHEN d.take THEN now() ELSE r.claimed_at END,
            CASE WHEN d.take THEN excluded.lease_seconds ELSE r.lease_seconds END,
            CASE WHEN d.take THEN excluded.lease_expires_at ELSE r.lease_expires_at END,
            CASE WHEN d.take THEN excluded.args_digest ELSE r.args_digest END,
            CASE WHEN d.take THEN excluded.job_class ELSE r.job_class END,
            CASE WHEN d.take THEN excluded.queue ELSE r.queue END,
            CASE WHEN d.take THEN excluded.args ELSE r.args END,
            r.duplicates + (NOT d.take AND NOT $12)::int,
            CASE WHEN d.take OR $12 THEN r.last_duplicate_at ELSE now() END,
            r.mismatches + (d.mismatch AND NOT $12)::int,
            d.mismatch,
            (r.repeat_times || now())[greatest(1, cardinality(r.repeat_times) - (20 - 2)):],
            CASE WHEN excluded.job_class IS NULL OR excluded.job_class = ANY (r.job_classes)
                 THEN r.job_classes ELSE r.job_classes || excluded.job_class END,
            now()
       FROM (SELECT m.mismatch,
                    NOT (m.mismatch AND $10)
                    AND (r.status = 'released'
                         OR (r.status = 'claimed' AND r.lease_expires_at <= now())) AS take
               FROM (SELECT r.args_digest IS NOT NULL
                            AND r.args_digest <> excluded.args_digest AS mismatch) AS m) AS d)
RETURNING r.claim_token = $3 AS won, r.status, r.last_claim, r.attempts, r.jid,
          r.duplicates, r.last_mismatch AS mismatch, r.takeovers,
          EXTRACT(EPOCH FROM r.lease_expires_at - now())::float8 AS lease_remaining,
          now() AS decided_at,
          -- Stored results (V7): what a repeat of a completed operation replays.
          r.result::text AS result, r.result_state"#;

const V11_DELIVER_SQL: &str = r#"
WITH look AS (
    SELECT status, jid, attempts, duplicates, args_digest, lease_expires_at,
           claim_token = $3 AS mine, last_claim,
           -- Stored results (V7): a completed record's replay, read in the same look.
           result::text AS result, result_state
      FROM idempotent_job_records
     WHERE job_type = $1 AND operation_key = $2),
first AS (
    INSERT INTO idempotent_job_records
        (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at,
         args_digest, job_class, queue, args, job_classes, first_facts)
    SELECT $1, $2, 'claimed', $3, $4, $5, now() + make_interval(secs => $5),
           $6, $7, $8,
           CASE WHEN strpos($9, '\u0000') > 0 THEN jsonb_build_object('idempotent_job:json', $9)
                ELSE $9::jsonb END,
           array_remove(ARRAY[$7::text], NULL), $10::jsonb
     WHERE NOT EXISTS (SELECT 1 FROM look)
    ON CONFLICT (job_type, operation_key) DO NOTHING
    RETURNING status, jid, attempts, duplicates, args_digest, lease_expires_at)
SELECT true AS inserted, true AS mine, 'first' AS last_claim, status, jid, attempts,
       duplicates, args_digest,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_remaining,
       now() AS decided_at, NULL::text AS result, NULL::text AS result_state
  FROM first
UNION ALL
SELECT false, mine, last_claim, status, jid, attempts, duplicates, args_digest,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8, now(), result, result_state
  FROM look"#;

const V11_RESOLVE_SQL: &str = r#"
UPDATE idempotent_job_records
   SET status = CASE WHEN $3 = 'done' THEN 'completed' ELSE 'released' END,
       completed_at = CASE WHEN $3 = 'done' THEN now() ELSE completed_at END,
       released_at = CASE WHEN $3 = 'done' THEN released_at ELSE now() END,
       resolution = $3, resolved_at = now(), updated_at = now()
 WHERE job_type = $1 AND operation_key = $2 AND status IN ('held', 'given_up')
RETURNING job_class, queue, coalesce(args ->> 'idempotent_job:json', args::text) AS args,
          first_facts::text AS first_facts"#;

/// The V11 claim statement's parameters for `req` with `token`, typed as the core sends them.
fn v11_params<'a>(req: &'a ClaimRequest, token: &'a Uuid) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    vec![
        (&req.job_type, Type::TEXT),
        (&req.operation_key, Type::TEXT),
        (token, Type::UUID),
        (&req.delivery_id, Type::TEXT),
        (&req.lease_seconds, Type::FLOAT8),
        (&req.args_digest, Type::TEXT),
        (&req.job_class, Type::TEXT),
        (&req.queue, Type::TEXT),
        (&req.args_json, Type::TEXT),
        (&req.refuse_mismatch, Type::BOOL),
        (&req.facts_json, Type::TEXT),
        (&req.returning, Type::BOOL),
    ]
}

/// An old (V11) worker's claim statement for `req` with `token`: (won, status, last_claim).
fn v11_claim(store: &Store, req: &ClaimRequest, token: Uuid) -> (bool, String, String) {
    let req = req.clone();
    store
        .with_conn(async |c| {
            let row = c
                .query_typed(V11_CLAIM_SQL, &v11_params(&req, &token))
                .await?;
            let row = &row[0];
            Ok((row.get("won"), row.get("status"), row.get("last_claim")))
        })
        .unwrap()
}

/// An old (V11) worker's first statement outside a transaction: whether it inserted.
fn v11_deliver(store: &Store, req: &ClaimRequest, token: Uuid) -> bool {
    let req = req.clone();
    store
        .with_conn(async |c| {
            let row = c
                .query_typed(V11_DELIVER_SQL, &{
                    // DELIVER_SQL took the claim's $1–$9 and the facts ($11) as $10.
                    let all = v11_params(&req, &token);
                    [&all[..9], &all[10..11]].concat()
                })
                .await?;
            Ok(row[0].get("inserted"))
        })
        .unwrap()
}

/// An old (V11) worker's rerun: the stored job class and arguments it re-sends, or None
/// when nothing was settled.
fn v11_rerun(store: &Store, req: &ClaimRequest) -> Option<(Option<String>, Option<String>)> {
    let req = req.clone();
    store
        .with_conn(async |c| {
            let rows = c
                .query_typed(
                    V11_RESOLVE_SQL,
                    &[
                        (&req.job_type, Type::TEXT),
                        (&req.operation_key, Type::TEXT),
                        (&"rerun", Type::TEXT),
                    ],
                )
                .await?;
            Ok(rows.first().map(|r| (r.get("job_class"), r.get("args"))))
        })
        .unwrap()
}

/// This version's rerun: the stored job class and arguments, or None.
fn rerun(store: &Store, req: &ClaimRequest) -> Option<(Option<String>, Option<String>)> {
    let req = req.clone();
    store
        .with_conn(async |c| {
            claim::resolve_stored(c, &req.job_type, &req.operation_key, Resolution::Rerun).await
        })
        .unwrap()
        .map(|s| (s.job_class, s.args_json))
}

/// The stored job's class and arguments on `req`'s record.
fn stored_job(store: &Store, req: &ClaimRequest) -> (Option<String>, Option<String>) {
    let req = req.clone();
    store
        .with_conn(async |c| {
            let row = c
                .query_one(
                    "SELECT job_class, args::text FROM idempotent_job_records \
                     WHERE job_type = $1 AND operation_key = $2",
                    &[&req.job_type, &req.operation_key],
                )
                .await?;
            Ok((row.get(0), row.get(1)))
        })
        .unwrap()
}

fn the_job(req: &ClaimRequest) -> (Option<String>, Option<String>) {
    (req.job_class.clone(), req.args_json.clone())
}

#[test]
fn old_and_new_workers_side_by_side_decide_every_record_and_rerun_its_stored_job() {
    let schema = "ij_rolling_v11";
    let store = store_in_through(schema, None);
    let t = "RollingJob";

    // An old worker's first claim stores the job; a new worker decides the record as
    // before, takes it over when stale, holds it, and its rerun re-sends the takeover's job.
    let old_first = request(t, "old-first", 30.0);
    let old_token = Uuid::new_v4();
    assert!(v11_deliver(&store, &old_first, old_token));
    assert_eq!(stored_job(&store, &old_first), the_job(&old_first));
    assert!(matches!(
        claim_one(&store, &old_first),
        ClaimAnswer::InProgress { .. }
    ));
    finish(&store, &old_first, old_token, Fenced::Expire);
    // The taker's job differs from the first claim's, so the rerun shows which one the
    // takeover stored.
    let taker = ClaimRequest {
        job_class: Some("RollingJobV2".into()),
        args_json: Some(r#"["taker"]"#.into()),
        ..old_first.clone()
    };
    let taken = claim_one(&store, &taker);
    assert!(matches!(
        taken,
        ClaimAnswer::Claimed {
            kind: ClaimKind::Takeover,
            ..
        }
    ));
    finish(&store, &old_first, token_of(&taken), Fenced::Hold);
    assert_ne!(the_job(&taker), the_job(&old_first));
    assert_eq!(rerun(&store, &old_first), Some(the_job(&taker)));

    // A new worker's first claim stores none; an old worker meets it as a live claim,
    // takes it over when stale (storing its job, as it always did) and holds it; a new
    // worker's rerun re-sends that job.
    let new_first = request(t, "new-first", 30.0);
    let token = token_of(&claim_one(&store, &new_first));
    assert_eq!(stored_job(&store, &new_first), (None, None));
    let (won, status, _) = v11_claim(&store, &new_first, Uuid::new_v4());
    assert!(!won && status == "claimed");
    finish(&store, &new_first, token, Fenced::Expire);
    let old_token = Uuid::new_v4();
    let (won, _, last_claim) = v11_claim(&store, &new_first, old_token);
    assert!(won && last_claim == "takeover");
    // The hold statement's text is V11's too.
    finish(&store, &new_first, old_token, Fenced::Hold);
    assert_eq!(rerun(&store, &new_first), Some(the_job(&new_first)));

    // A new worker holds after its own takeover; an old worker's rerun finds the job.
    let new_held = request(t, "new-held", 30.0);
    let token = token_of(&claim_one(&store, &new_held));
    finish(&store, &new_held, token, Fenced::Expire);
    let token = token_of(&claim_one(&store, &new_held));
    finish(&store, &new_held, token, Fenced::Hold);
    assert_eq!(v11_rerun(&store, &new_held), Some(the_job(&new_held)));
    // The rerun released it: a new delivery claims it as a retry.
    assert!(matches!(
        claim_one(&store, &new_held),
        ClaimAnswer::Claimed {
            kind: ClaimKind::Retry,
            ..
        }
    ));
    drop_schema(schema);
}

/// The columns (name, type, nullability, default) and index definitions of the record
/// table in `schema`.
fn table_shape(admin: &common::Admin, schema: &str) -> String {
    admin.text(&format!(
        "SELECT string_agg(line, E'\\n' ORDER BY line) FROM ( \
           SELECT format('%s %s %s %s', column_name, data_type, is_nullable, column_default) AS line \
           FROM information_schema.columns \
           WHERE table_schema = '{schema}' AND table_name = 'idempotent_job_records' \
           UNION ALL \
           SELECT replace(indexdef, '{schema}.', '') FROM pg_indexes \
           WHERE schemaname = '{schema}' AND tablename = 'idempotent_job_records') lines"
    ))
}

/// `schema_sql()` (what `rake idempotent_job:sql` and Python's `SCHEMA_SQL` print for
/// teams that apply migrations with their own tools) run as one script on an empty
/// schema makes the table the migration runner makes. Its migrations came out in
/// file-name order (V10 and V11 before V1) and the script failed on a table that did
/// not exist yet.
#[test]
fn the_schema_script_applied_by_hand_makes_the_table_the_runner_makes() {
    let migrated = store_in_through("schema_by_runner", None);
    let admin = common::Admin::new();
    admin.exec(
        "DROP SCHEMA IF EXISTS schema_by_hand CASCADE; CREATE SCHEMA schema_by_hand; \
         SET search_path TO schema_by_hand",
    );
    admin.exec(&migrate::schema_sql());
    admin.exec("RESET search_path");
    let by_hand = table_shape(&admin, "schema_by_hand");
    assert!(by_hand.contains("operation_key"), "{by_hand}");
    assert_eq!(by_hand, table_shape(&admin, "schema_by_runner"));
    drop(migrated);
    drop_schema("schema_by_runner");
    drop_schema("schema_by_hand");
}
