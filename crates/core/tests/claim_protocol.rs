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

mod common;
use common::StoreExt;
use common::{
    counted, database_url, find_record, prepared_on_connection, request, runs_of, store, store_with,
};

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

#[test]
fn bad_arguments_are_rejected_before_any_statement() {
    let store = store();
    let err = claim(&store, &request("Job", "k", 0.0)).unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("lease")),
        "{err}"
    );
    let err = claim(&store, &request("Job", "", 1.0)).unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("must not be empty")),
        "{err}"
    );
    let err = claim(&store, &request("Job", &"x".repeat(3000), 1.0)).unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("bytes")),
        "{err}"
    );
}

#[test]
fn a_missing_table_says_to_run_the_migration() {
    let url = format!("{}?options=-csearch_path%3Dno_such_schema", database_url());
    let store = Store::new(Config::new(url)).unwrap();
    let err = claim(&store, &request("Job", "1", 1.0)).unwrap_err();
    assert_eq!(err.sqlstate(), Some("42P01"), "{err}");
    assert!(err.to_string().contains("apply the migrations"), "{err}");
    assert_eq!(
        err.remedies(),
        &[idempotent_job_core::error::Remedy::Migrate]
    );
}

#[test]
fn an_unreachable_database_is_a_connection_error() {
    let mut config = Config::new("postgres://postgres:hunter2-secret@127.0.0.1:1/x");
    config.connect_timeout = 2.0;
    let store = Store::new(config).unwrap();
    let err = claim(&store, &request("Job", "1", 1.0)).unwrap_err();
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert!(!err.to_string().contains("hunter2-secret"), "{err}");
}

#[test]
fn an_abandoned_call_never_returns_its_busy_connection_to_the_pool() {
    store(); // migrated
    let mut config = Config::new(database_url());
    config.pool_size = 1;
    let store = Store::new(config).unwrap();
    let req = request(&unique("abandon"), "1", 30.0);
    claim(&store, &req).unwrap();

    // Another session holds the record's row lock, so the next claim blocks.
    let locking = hold_row_lock(&req, Duration::from_secs(3));
    std::thread::sleep(Duration::from_millis(300));

    // The caller's thread is interrupted after 300 ms and gives the call up (what
    // Ruby's Timeout does through the unblocking function).
    let give_up = || true;
    let interrupt = Interrupt::new(&give_up);
    let started = Instant::now();
    let blocked = std::thread::scope(|s| {
        let notifier = interrupt.notifier();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            notifier.notify_one();
        });
        store.run(|pool, _| with_conn(pool, &interrupt, async |c| claim::claim(c, &req).await))
    });
    assert!(
        matches!(blocked, Err(Error::Interrupted)),
        "the claim should have been blocked by the row lock, then given up: {blocked:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // The pool's only connection was detached: another operation gets a fresh one
    // at once instead of queueing behind the orphaned, still-blocked statement.
    let started = Instant::now();
    let other = request(&unique("abandon"), "2", 30.0);
    assert!(matches!(
        claim(&store, &other).unwrap(),
        ClaimAnswer::Claimed { .. }
    ));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    locking.join().unwrap();
}

fn a_different_payload_is_flagged_and_refused_when_asked(store: Store) {
    let req = request(&unique("mismatch"), "1", 0.2);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    let mut other = req.clone();
    other.args_digest = Some("digest-b".into());
    let decision = decide(&store, &other).unwrap();
    assert!(decision.mismatch, "{decision:?}");
    assert!(!decide(&store, &req).unwrap().mismatch);

    // A stale claim is not taken over by a mismatched delivery that refuses them.
    std::thread::sleep(Duration::from_millis(300));
    other.refuse_mismatch = true;
    let decision = decide(&store, &other).unwrap();
    assert_eq!(decision.outcome, ClaimAnswer::Refused { duplicates: 3 });
    assert!(matches!(
        fenced(&store, &req, Fenced::Complete, token),
        Ok(())
    ));
    let record = find(&store, &req);
    assert_eq!((record.mismatches, record.last_mismatch), (2, true));
}

fn hold_and_give_up_stop_later_deliveries_until_resolved(store: Store) {
    let held = request(&unique("held"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &held).unwrap());
    fenced(&store, &held, Fenced::Hold, token).unwrap();
    assert_eq!(
        claim(&store, &held).unwrap(),
        ClaimAnswer::Held { duplicates: 1 }
    );
    let listed = store
        .with_conn(async |c| claim::held(c, Some(&held.job_type), 10).await)
        .unwrap();
    assert_eq!(listed, vec![(held.job_type.clone(), "1".to_string())]);

    let resolve = |req: &ClaimRequest, how| {
        let req = req.clone();
        store
            .with_conn(async |c| claim::resolve(c, &req.job_type, &req.operation_key, how).await)
            .unwrap()
    };
    // The rerun answers what the last claim stored: what a door re-sends.
    let stored = {
        let req = held.clone();
        store
            .with_conn(async |c| {
                claim::resolve_stored(c, &req.job_type, &req.operation_key, Resolution::Rerun).await
            })
            .unwrap()
    };
    assert_eq!(
        stored,
        Some(claim::StoredDelivery {
            job_type: held.job_type.clone(),
            operation_key: "1".into(),
            job_class: Some("ExampleJob".into()),
            queue: Some("default".into()),
            args_json: Some(r#"["1"]"#.into()),
            first_facts_json: Some(r#"{"delivery": "d-1"}"#.into()),
        })
    );
    assert!(
        !resolve(&held, Resolution::Rerun),
        "only held or given-up operations resolve"
    );
    let (again, kind, attempt) = token_of(claim(&store, &held).unwrap());
    assert_eq!((kind, attempt), (ClaimKind::Retry, 2));
    complete(&store, &held, again).unwrap();

    let skipped = request(&unique("given-up"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &skipped).unwrap());
    fenced(&store, &skipped, Fenced::GiveUp, token).unwrap();
    assert_eq!(
        claim(&store, &skipped).unwrap(),
        ClaimAnswer::GivenUp { duplicates: 1 }
    );
    assert!(resolve(&skipped, Resolution::Done));
    assert!(matches!(
        claim(&store, &skipped).unwrap(),
        ClaimAnswer::Completed { .. }
    ));
    assert_eq!(find(&store, &skipped).resolution.as_deref(), Some("done"));
}

fn expiring_a_claim_makes_the_next_delivery_a_takeover(store: Store) {
    let req = request(&unique("expire"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    fenced(&store, &req, Fenced::Expire, token).unwrap();
    let (_, kind, _) = token_of(claim(&store, &req).unwrap());
    assert_eq!(kind, ClaimKind::Takeover);
    assert!(matches!(
        fenced(&store, &req, Fenced::Hold, token),
        Err(Error::LostClaim { .. })
    ));
}

fn a_heartbeat_keeps_a_long_claim_alive_and_stops_when_told(store: Store) {
    let req = request(&unique("heartbeat"), "1", 0.6);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    let pool = store.pool().unwrap();
    let beat = pool.heartbeat(
        req.job_type.clone(),
        req.operation_key.clone(),
        token,
        0.6,
        60.0,
    );
    std::thread::sleep(Duration::from_millis(1800)); // three leases
    assert!(matches!(
        claim(&store, &req).unwrap(),
        ClaimAnswer::InProgress { .. }
    ));
    let report = beat.stop();
    assert!(
        report.renewals >= 4 && !report.lost && !report.max_run_reached,
        "{report:?}"
    );
    assert!(find(&store, &req).heartbeat_at.is_some());

    std::thread::sleep(Duration::from_millis(800)); // stopped: the lease runs out
    let (_, kind, _) = token_of(claim(&store, &req).unwrap());
    assert_eq!(kind, ClaimKind::Takeover);
}

fn a_heartbeat_stops_at_the_maximum_run_time_and_notices_a_lost_claim(store: Store) {
    let pool = store.pool().unwrap();
    let req = request(&unique("max-run"), "1", 0.3);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    let beat = pool.heartbeat(
        req.job_type.clone(),
        req.operation_key.clone(),
        token,
        0.3,
        0.35,
    );
    std::thread::sleep(Duration::from_millis(900));
    let report = beat.stop();
    assert!(report.max_run_reached, "{report:?}");
    assert!(find(&store, &req).lease_expired);

    let lost = request(&unique("lost"), "1", 0.3);
    let (token, _, _) = token_of(claim(&store, &lost).unwrap());
    fenced(&store, &lost, Fenced::Expire, token).unwrap();
    token_of(claim(&store, &lost).unwrap()); // taken over
    let beat = pool.heartbeat(
        lost.job_type.clone(),
        lost.operation_key.clone(),
        token,
        0.3,
        60.0,
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(beat.stop().lost);
}

fn completion_and_release_repeat_safely_for_their_own_token(store: Store) {
    let req = request(&unique("repeat"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    complete(&store, &req, token).unwrap();
    let first = find(&store, &req).completed_at;
    complete(&store, &req, token).unwrap();
    assert_eq!(find(&store, &req).completed_at, first);
    assert!(matches!(
        release(&store, &req, token),
        Err(Error::LostClaim { .. })
    ));

    let other = request(&unique("repeat"), "2", 30.0);
    let (token, _, _) = token_of(claim(&store, &other).unwrap());
    release(&store, &other, token).unwrap();
    release(&store, &other, token).unwrap();
    assert!(matches!(
        complete(&store, &other, token),
        Err(Error::LostClaim { .. })
    ));
}

#[test]
fn named_statements_are_prepared_once_per_connection_and_reused() {
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
fn with_prepared_statements_off_nothing_is_prepared() {
    let store = store_with(false, 1);
    let req = request(&unique("unnamed"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    claim(&store, &req).unwrap();
    complete(&store, &req, token).unwrap();
    find(&store, &req);
    assert_eq!(prepared_on_connection(&store), vec![]);
}

#[test]
fn a_statement_the_server_forgot_names_the_setting_and_is_prepared_again_next_time() {
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
fn the_gems_named_statements_are_planned_once_per_connection_generically() {
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
fn an_asynchronous_completion_completes_the_claim() {
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
fn an_idle_connection_the_server_terminated_is_replaced_at_checkout() {
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
fn the_record_is_defined_once_its_select_list_names_every_field_of_the_struct() {
    let store = store_with(true, 1);
    let req = request(&unique("columns"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &req).unwrap());
    complete(&store, &req, token).unwrap();
    let record = find(&store, &req);
    // FIND_SQL's select list names each expression after its field, in the struct's
    // order, and every table column it reads is one the schema check knows.
    let names: Vec<&str> = record.fields().map(|(name, _)| name).collect();
    assert_eq!(names, claim::Record::COLUMNS);
    let mut at = 0;
    for name in claim::Record::COLUMNS {
        let found = claim::FIND_SQL[at..]
            .find(&format!(" AS {name}"))
            .unwrap_or_else(|| panic!("{name} after byte {at} of {}", claim::FIND_SQL));
        at += found + 1;
        let column = name.strip_suffix("_json").unwrap_or(name);
        let computed = ["lease_expired"].contains(name);
        assert!(
            computed || idempotent_job_core::schema::COLUMNS.contains(&column),
            "{name}"
        );
    }
    assert_eq!(record.status, "completed");
    assert_eq!(record.args_json.as_deref(), Some(r#"["1"]"#));
}

/// Holds the row lock of `req`'s record in another session for `hold`, from a thread of
/// its own (joined by the caller); returns once the lock is taken.
fn hold_row_lock(req: &ClaimRequest, hold: Duration) -> std::thread::JoinHandle<()> {
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
fn settle_waits_for_a_batch_the_writer_already_took() {
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
