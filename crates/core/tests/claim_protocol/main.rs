//! The claim protocol against a real PostgreSQL (DATABASE_URL, as set by bin/test).
//! Each test uses its own job type, so tests run in parallel on one database.

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::claim::{self, ClaimAnswer, ClaimKind, ClaimRequest, Fenced, Resolution};
use idempotent_job_core::config::{Config, REPEATS_KEPT};
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::Error;
use idempotent_job_core::migrate;
use idempotent_job_core::pool::with_conn;
use idempotent_job_core::store::Store;

#[path = "../common/mod.rs"]
mod common;
mod errors_and_states;
mod statements;
use common::StoreExt;
use common::{
    counted, database_url, find_record, prepared_on_connection, request, runs_of, store, store_with,
};
use errors_and_states::*;
use statements::*;

/// Runs each protocol scenario twice: with the gem's statements sent as named
/// prepared statements (the default) and as unnamed ones (`prepared_statements: false`).
macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod prepared_statements_on {
            $(#[test]
            fn $name() {
                super::$name(super::store_with(true, 10))
            })*
        }
        mod prepared_statements_off {
            $(#[test]
            fn $name() {
                super::$name(super::store_with(false, 10))
            })*
        }
    };
}

in_both_modes!(
    first_delivery_claims_then_duplicates_are_turned_away,
    concurrent_deliveries_have_exactly_one_winner,
    an_expired_lease_is_taken_over_once_and_fences_the_old_holder,
    a_released_claim_is_claimed_again_by_the_retry,
    a_different_payload_is_flagged_and_refused_when_asked,
    hold_and_give_up_stop_later_deliveries_until_resolved,
    expiring_a_claim_makes_the_next_delivery_a_takeover,
    a_heartbeat_keeps_a_long_claim_alive_and_stops_when_told,
    a_heartbeat_stops_at_the_maximum_run_time_and_notices_a_lost_claim,
    completion_and_release_repeat_safely_for_their_own_token,
    the_first_claim_keeps_its_facts_and_repeats_never_change_them,
    a_record_keeps_only_its_latest_repeats,
    a_first_delivery_writes_no_column_it_does_not_need,
    a_rerun_of_a_record_without_a_stored_job_is_refused,
    the_record_tells_whether_it_holds_a_stored_job_by_the_resolves_rule,
);

fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4())
}

fn decide(store: &Store, req: &ClaimRequest) -> Result<claim::ClaimReply, Error> {
    let req = req.clone();
    store.run(|pool, i| claim::deliver(pool, i, &req))
}

fn claim(store: &Store, req: &ClaimRequest) -> Result<ClaimAnswer, Error> {
    decide(store, req).map(|d| d.outcome)
}

fn fenced(
    store: &Store,
    req: &ClaimRequest,
    change: Fenced,
    token: uuid::Uuid,
) -> Result<(), Error> {
    let req = req.clone();
    store.with_conn(async |c| {
        claim::fenced(
            c,
            change,
            &req.job_type,
            &req.operation_key,
            token,
            Some("why"),
        )
        .await
    })
}

fn find(store: &Store, req: &ClaimRequest) -> claim::Record {
    find_record(store, req).expect("record exists")
}

fn complete(store: &Store, req: &ClaimRequest, token: uuid::Uuid) -> Result<(), Error> {
    let req = req.clone();
    store.with_conn(async |c| claim::complete(c, &req.job_type, &req.operation_key, token).await)
}

fn release(store: &Store, req: &ClaimRequest, token: uuid::Uuid) -> Result<(), Error> {
    let req = req.clone();
    store.with_conn(async |c| {
        claim::release(
            c,
            &req.job_type,
            &req.operation_key,
            token,
            "RuntimeError: boom",
        )
        .await
    })
}

fn token_of(outcome: ClaimAnswer) -> (uuid::Uuid, ClaimKind, i32) {
    match outcome {
        ClaimAnswer::Claimed {
            token,
            kind,
            attempt,
            ..
        } => (token, kind, attempt),
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[test]
fn migrations_are_recorded_and_safe_to_run_twice() {
    let store = store();
    let applied = store.run(|pool, i| migrate::migrate(pool, i)).unwrap();
    assert!(applied.is_empty(), "second run applied {applied:?}");
    assert!(migrate::schema_sql().contains("CREATE TABLE idempotent_job_records"));
}

fn first_delivery_claims_then_duplicates_are_turned_away(store: Store) {
    let req = request(&unique("first"), "42", 30.0);
    let (token, kind, attempt) = token_of(claim(&store, &req).unwrap());
    assert_eq!((kind, attempt), (ClaimKind::First, 1));

    match claim(&store, &req).unwrap() {
        ClaimAnswer::InProgress {
            lease_remaining,
            holder_delivery_id,
            duplicates,
            ..
        } => {
            assert!(
                lease_remaining > 25.0 && lease_remaining <= 30.0,
                "{lease_remaining}"
            );
            assert_eq!(holder_delivery_id.as_deref(), Some("jid-42"));
            assert_eq!(duplicates, 1);
        }
        other => panic!("expected in progress, got {other:?}"),
    }
    complete(&store, &req, token).unwrap();
    // The duplicate's bookkeeping is written in the background: once written, the
    // next answer counts it.
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    assert_eq!(
        claim(&store, &req).unwrap(),
        ClaimAnswer::Completed {
            duplicates: 2,
            replay: None
        }
    );

    let record = find_record(&store, &req).expect("record exists");
    assert_eq!(record.status, "completed");
    assert_eq!(record.attempts, 1);
    assert_eq!(record.duplicates, 2);
    assert!(record.completed_at.is_some() && record.last_duplicate_at.is_some());
    assert_eq!(record.claim_token, token);
}

fn concurrent_deliveries_have_exactly_one_winner(store: Store) {
    let store = Arc::new(store);
    let req = request(&unique("race"), "7", 30.0);
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (store, req, barrier) = (store.clone(), req.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                claim(&store, &req).unwrap()
            })
        })
        .collect();
    let outcomes: Vec<ClaimAnswer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let winners = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimAnswer::Claimed { .. }))
        .count();
    let waiting = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimAnswer::InProgress { .. }))
        .count();
    assert_eq!((winners, waiting), (1, 15), "{outcomes:?}");
}

fn an_expired_lease_is_taken_over_once_and_fences_the_old_holder(store: Store) {
    let store = Arc::new(store);
    let req = request(&unique("stale"), "9", 0.3);
    let (old, _, _) = token_of(claim(&store, &req).unwrap());
    std::thread::sleep(Duration::from_millis(400));

    // Several deliveries race for the stale claim: exactly one takes it over.
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let (store, mut req) = (store.clone(), req.clone());
            req.lease_seconds = 30.0;
            std::thread::spawn(move || claim(&store, &req).unwrap())
        })
        .collect();
    let outcomes: Vec<ClaimAnswer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let takeovers: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            ClaimAnswer::Claimed {
                token,
                kind,
                attempt,
                ..
            } => Some((*token, *kind, *attempt)),
            _ => None,
        })
        .collect();
    assert_eq!(takeovers.len(), 1, "{outcomes:?}");
    let (new, kind, attempt) = takeovers[0];
    assert_eq!((kind, attempt), (ClaimKind::Takeover, 2));

    // The stalled first holder wakes up: it can neither complete nor release.
    assert!(matches!(
        complete(&store, &req, old),
        Err(Error::LostClaim { .. })
    ));
    assert!(matches!(
        release(&store, &req, old),
        Err(Error::LostClaim { .. })
    ));
    complete(&store, &req, new).unwrap();
    assert!(matches!(
        claim(&store, &req).unwrap(),
        ClaimAnswer::Completed { .. }
    ));
}

/// The record's `first_facts` as JSON text (NULL: none sent).
/// The operation's `repeat_times`, once this process's queued bookkeeping is written.
fn repeat_times(store: &Store, req: &ClaimRequest) -> Vec<chrono::DateTime<chrono::Utc>> {
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    repeat_times_written(store, req)
}

/// The operation's `repeat_times` as written now.
fn repeat_times_written(store: &Store, req: &ClaimRequest) -> Vec<chrono::DateTime<chrono::Utc>> {
    let job_type = req.job_type.clone();
    let since = chrono::Utc::now() - chrono::Duration::hours(1);
    let rows = store
        .with_conn(async |c| claim::repeats(c, since, Some(&job_type)).await)
        .unwrap();
    rows.into_iter()
        .find(|r| r.operation_key == req.operation_key)
        .map_or_else(Vec::new, |r| r.repeat_times)
}

/// Both statements that append repeats (the claim for a retry, the bookkeeping for a
/// duplicate) keep the latest `REPEATS_KEPT` of them, the one number the Rust side uses.
fn a_record_keeps_only_its_latest_repeats(store: Store) {
    let req = request(&unique("Kept"), "k", 30.0);
    let (mut token, ..) = token_of(claim(&store, &req).unwrap());
    for _ in 0..REPEATS_KEPT + 3 {
        release(&store, &req, token).unwrap();
        // The claim statement alone (no bookkeeping queued): it trims `repeat_times` itself.
        let retried = store.with_conn(async |c| claim::claim(c, &req).await);
        let (next, kind, _) = token_of(retried.unwrap().outcome);
        assert_eq!(kind, ClaimKind::Retry);
        token = next;
    }
    let by_claims = repeat_times_written(&store, &req);
    assert_eq!(by_claims.len(), REPEATS_KEPT);
    complete(&store, &req, token).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            claim(&store, &req).unwrap(),
            ClaimAnswer::Completed { .. }
        ));
    }
    let by_bookkeeping = repeat_times(&store, &req);
    assert_eq!(by_bookkeeping.len(), REPEATS_KEPT);
    assert_eq!(
        by_bookkeeping[..REPEATS_KEPT - 3],
        by_claims[3..],
        "the oldest went first"
    );
}

fn first_facts(store: &Store, req: &ClaimRequest) -> Option<String> {
    let req = req.clone();
    store
        .with_conn(async |c| {
            let row = c
                .query_one(
                    "SELECT first_facts::text FROM idempotent_job_records \
                     WHERE job_type = $1 AND operation_key = $2",
                    &[&req.job_type, &req.operation_key],
                )
                .await?;
            Ok(row.try_get(0)?)
        })
        .unwrap()
}

/// The columns of `req`'s record that hold a value a first delivery with no repeat
/// does not need (issue 31): the stored job (rerun), the stored result, the repeats', errors'
/// and resolutions' columns; read back from the row.
fn unneeded_values(store: &Store, req: &ClaimRequest) -> Vec<String> {
    let req = req.clone();
    store
        .with_conn(async |c| {
            let row = c
                .query_one(
                    "SELECT array_remove(ARRAY[
                        CASE WHEN job_class IS NOT NULL THEN 'job_class' END,
                        CASE WHEN queue IS NOT NULL THEN 'queue' END,
                        CASE WHEN args IS NOT NULL THEN 'args' END,
                        CASE WHEN result IS NOT NULL THEN 'result' END,
                        CASE WHEN result_state IS NOT NULL THEN 'result_state' END,
                        CASE WHEN cardinality(repeat_times) > 0 THEN 'repeat_times' END,
                        CASE WHEN repeat_facts <> '[]' THEN 'repeat_facts' END,
                        CASE WHEN duplicates <> 0 THEN 'duplicates' END,
                        CASE WHEN last_duplicate_at IS NOT NULL THEN 'last_duplicate_at' END,
                        CASE WHEN mismatches <> 0 OR last_mismatch THEN 'mismatches' END,
                        CASE WHEN last_error IS NOT NULL THEN 'last_error' END,
                        CASE WHEN released_at IS NOT NULL THEN 'released_at' END,
                        CASE WHEN heartbeat_at IS NOT NULL THEN 'heartbeat_at' END,
                        CASE WHEN held_at IS NOT NULL THEN 'held_at' END,
                        CASE WHEN given_up_at IS NOT NULL THEN 'given_up_at' END,
                        CASE WHEN resolution IS NOT NULL THEN 'resolution' END,
                        CASE WHEN resolved_at IS NOT NULL THEN 'resolved_at' END], NULL)
                       FROM idempotent_job_records
                      WHERE job_type = $1 AND operation_key = $2",
                    &[&req.job_type, &req.operation_key],
                )
                .await?;
            Ok(row.try_get(0)?)
        })
        .unwrap()
}

fn a_first_delivery_writes_no_column_it_does_not_need(store: Store) {
    let job_type = unique("narrow");
    // A first claim through the look (DELIVER_SQL), then its completion.
    let req = request(&job_type, "1", 30.0);
    let (token, kind, _) = token_of(claim(&store, &req).unwrap());
    assert_eq!(kind, ClaimKind::First);
    assert_eq!(unneeded_values(&store, &req), Vec::<String>::new());
    complete(&store, &req, token).unwrap();
    assert_eq!(unneeded_values(&store, &req), Vec::<String>::new());
    // It keeps what mismatch detection and the repeats report need.
    assert_eq!(find(&store, &req).args_digest.as_deref(), Some("digest-a"));
    assert_eq!(
        first_facts(&store, &req),
        Some(r#"{"delivery": "d-1"}"#.into())
    );

    // A first claim through CLAIM_SQL (a transactional session's) writes none either.
    let direct = request(&job_type, "2", 30.0);
    let sent = direct.clone();
    store
        .with_conn(async |c| claim::claim(c, &sent).await)
        .unwrap();
    assert_eq!(unneeded_values(&store, &direct), Vec::<String>::new());
}

fn a_rerun_of_a_record_without_a_stored_job_is_refused(store: Store) {
    // Held without a takeover (by hand: the protocol holds only after one), so no
    // delivery stored its job.
    let req = request(&unique("no-stored-job"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    fenced(&store, &req, Fenced::Hold, token).unwrap();
    let resolve = |how| {
        let req = req.clone();
        store.with_conn(async |c| {
            claim::resolve_stored(c, &req.job_type, &req.operation_key, how).await
        })
    };
    match resolve(Resolution::Rerun) {
        Err(Error::Config(message)) => assert!(
            message.contains(&format!(
                "cannot rerun {} operation \"1\": the record (held) holds no stored job",
                req.job_type
            )),
            "{message}"
        ),
        other => panic!("expected a refused rerun, got {other:?}"),
    }
    assert_eq!(find(&store, &req).status, "held", "the record stays held");
    assert!(resolve(Resolution::Done).unwrap().is_some());
    assert_eq!(find(&store, &req).status, "completed");
}

fn the_record_tells_whether_it_holds_a_stored_job_by_the_resolves_rule(store: Store) {
    // The record's `stored_job` (what both bindings show) is the rule the resolve
    // applies (`holds_stored_job!`): false after a first claim, whose rerun is refused;
    // true after a takeover (the claim that stores the job), whose rerun settles it.
    let job_type = unique("stored-job-field");
    let resolve = |req: &ClaimRequest, how| {
        let req = req.clone();
        store.with_conn(async |c| {
            claim::resolve_stored(c, &req.job_type, &req.operation_key, how).await
        })
    };
    let first = request(&job_type, "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &first).unwrap());
    let record = find(&store, &first);
    assert!(!record.stored_job);
    assert_eq!(record.job_classes, ["ExampleJob"]);
    fenced(&store, &first, Fenced::Hold, token).unwrap();
    assert!(matches!(
        resolve(&first, Resolution::Rerun),
        Err(Error::Config(_))
    ));

    let taken = request(&job_type, "2", 30.0);
    let (token, _, _) = token_of(claim(&store, &taken).unwrap());
    fenced(&store, &taken, Fenced::Expire, token).unwrap();
    let mut taker = taken.clone();
    taker.job_class = Some("TakerJob".into());
    let (token, kind, _) = token_of(claim(&store, &taker).unwrap());
    assert_eq!(kind, ClaimKind::Takeover);
    let record = find(&store, &taken);
    assert!(record.stored_job);
    assert_eq!(record.job_classes, ["ExampleJob", "TakerJob"]);
    fenced(&store, &taken, Fenced::Hold, token).unwrap();
    let resolved = store
        .with_conn(async |c| {
            claim::resolve_record(c, &taken.job_type, &taken.operation_key, Resolution::Rerun).await
        })
        .unwrap()
        .expect("a held record with a stored job is settled by a rerun");
    assert!(resolved.record.stored_job);
    assert_eq!(resolved.record.status, "released");
}

fn the_first_claim_keeps_its_facts_and_repeats_never_change_them(store: Store) {
    let job_type = unique("first-facts");
    // A first claim through the look (DELIVER_SQL) keeps its delivery's facts.
    let req = request(&job_type, "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    let kept = Some(r#"{"delivery": "d-1"}"#.to_string());
    assert_eq!(first_facts(&store, &req), kept);
    // A duplicate (read-only look), a retry and a takeover (CLAIM_SQL) keep them.
    let mut again = req.clone();
    again.facts_json = Some(r#"{"delivery":"again"}"#.into());
    assert!(matches!(
        claim(&store, &again).unwrap(),
        ClaimAnswer::InProgress { .. }
    ));
    release(&store, &req, token).unwrap();
    let (token, kind, _) = token_of(claim(&store, &again).unwrap());
    assert_eq!(kind, ClaimKind::Retry);
    fenced(&store, &req, Fenced::Expire, token).unwrap();
    let (_, kind, _) = token_of(claim(&store, &again).unwrap());
    assert_eq!(kind, ClaimKind::Takeover);
    assert_eq!(first_facts(&store, &req), kept);

    // A first claim through CLAIM_SQL (as a transactional session makes it) keeps them too.
    let direct = request(&job_type, "2", 30.0);
    let sent = direct.clone();
    store
        .with_conn(async |c| claim::claim(c, &sent).await)
        .unwrap();
    assert_eq!(
        first_facts(&store, &direct),
        Some(r#"{"delivery": "d-2"}"#.to_string())
    );
    // A delivery that sent no facts keeps none.
    let mut bare = request(&job_type, "3", 30.0);
    bare.facts_json = None;
    claim(&store, &bare).unwrap();
    assert_eq!(first_facts(&store, &bare), None);

    // The repeats report reads them beside each repeat's recorded facts.
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    let since = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
    let rows = store
        .with_conn(async |c| claim::repeats(c, since, Some(&job_type)).await)
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].first_facts, kept);
    assert_eq!(rows[0].delivery_id.as_deref(), Some("jid-1"));
    let repeats: serde_json::Value = serde_json::from_str(&rows[0].repeat_facts).unwrap();
    let decisions: Vec<_> = repeats
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["decision"].as_str(), e["facts"]["delivery"].as_str()))
        .collect();
    assert_eq!(
        decisions,
        [
            (Some("in_progress"), Some("again")),
            (Some("retry"), Some("again")),
            (Some("takeover"), Some("again"))
        ]
    );
}

fn a_released_claim_is_claimed_again_by_the_retry(store: Store) {
    let req = request(&unique("retry"), "5", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    release(&store, &req, token).unwrap();
    let (again, kind, attempt) = token_of(claim(&store, &req).unwrap());
    assert_eq!((kind, attempt), (ClaimKind::Retry, 2));
    assert_ne!(token, again);
    assert!(matches!(
        complete(&store, &req, token),
        Err(Error::LostClaim { .. })
    ));
    complete(&store, &req, again).unwrap();
}
