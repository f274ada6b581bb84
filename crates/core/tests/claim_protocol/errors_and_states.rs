//! Bad arguments, a missing table, an unreachable database, an abandoned call; mismatch,
//! hold and give-up, expiry, heartbeats, and completions repeated for their own token.

use super::*;

#[test]
pub(crate) fn bad_arguments_are_rejected_before_any_statement() {
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
pub(crate) fn a_missing_table_says_to_run_the_migration() {
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
pub(crate) fn an_unreachable_database_is_a_connection_error() {
    let mut config = Config::new("postgres://postgres:hunter2-secret@127.0.0.1:1/x");
    config.connect_timeout = 2.0;
    let store = Store::new(config).unwrap();
    let err = claim(&store, &request("Job", "1", 1.0)).unwrap_err();
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert!(!err.to_string().contains("hunter2-secret"), "{err}");
}

#[test]
pub(crate) fn an_unreachable_hostaddr_is_named_with_its_host() {
    // libpq's hostaddr: the address connected to (the host only names the server for
    // TLS), so the message names the address tried, with the host when both are given.
    for (url, named) in [
        (
            "postgres://u@db.invalid:1/x?hostaddr=127.0.0.2",
            "connecting to 127.0.0.2:1 (host db.invalid)",
        ),
        (
            "postgres://u@:1/x?hostaddr=127.0.0.3",
            "connecting to 127.0.0.3:1:",
        ),
    ] {
        assert_unreachable_named(url, named);
    }
}

/// A claim through `url`, which nothing answers, fails with a ConnectionError whose
/// message contains `named` (the address tried, as the connection texts word it).
fn assert_unreachable_named(url: &str, named: &str) {
    let mut config = Config::new(url);
    config.connect_timeout = 1.0;
    config.deadline = 1.0;
    let store = Store::new(config).unwrap();
    let err = claim(&store, &request("Job", "1", 1.0)).unwrap_err();
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert!(err.to_string().contains(named), "{url}: {err}");
}

#[test]
pub(crate) fn an_unreachable_ipv6_address_is_named_in_brackets() {
    // "::1:1" reads as an address alone; "[::1]:1" is the address and its port (the
    // URL's own spelling), for a host and for a hostaddr alike.
    for (url, named) in [
        ("postgres://u@[::1]:1/x", "connecting to [::1]:1:"),
        (
            "postgres://u@db.invalid:1/x?hostaddr=::1",
            "connecting to [::1]:1 (host db.invalid)",
        ),
    ] {
        assert_unreachable_named(url, named);
    }
}

#[test]
pub(crate) fn an_abandoned_call_never_returns_its_busy_connection_to_the_pool() {
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

pub(crate) fn a_different_payload_is_flagged_and_refused_when_asked(store: Store) {
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

pub(crate) fn hold_and_give_up_stop_later_deliveries_until_resolved(store: Store) {
    // Held as the protocol holds: by the delivery that took a stale claim over, which
    // stores its job (what a rerun re-sends; a first claim stores none, issue 31).
    let held = request(&unique("held"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &held).unwrap());
    fenced(&store, &held, Fenced::Expire, token).unwrap();
    let (token, kind, _) = token_of(claim(&store, &held).unwrap());
    assert_eq!(kind, ClaimKind::Takeover);
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
    assert_eq!((kind, attempt), (ClaimKind::Retry, 3));
    complete(&store, &held, again).unwrap();

    let skipped = request(&unique("given-up"), "1", 30.0);
    let (token, _, _) = token_of(claim(&store, &skipped).unwrap());
    fenced(&store, &skipped, Fenced::Expire, token).unwrap();
    let (token, _, _) = token_of(claim(&store, &skipped).unwrap());
    fenced(&store, &skipped, Fenced::GiveUp, token).unwrap();
    assert_eq!(
        claim(&store, &skipped).unwrap(),
        ClaimAnswer::GivenUp { duplicates: 1 }
    );
    // The resolve answers the record its one statement left: what a read finds after it
    // (the queued repeat bookkeeping of the duplicate above written first).
    find(&store, &skipped);
    let resolved = {
        let req = skipped.clone();
        store
            .with_conn(async |c| {
                claim::resolve_record(c, &req.job_type, &req.operation_key, Resolution::Done).await
            })
            .unwrap()
            .expect("a given-up operation resolves")
    };
    let found = find(&store, &skipped);
    assert_eq!(resolved.record.status, "completed");
    assert_eq!(
        format!("{:?}", resolved.record.fields().collect::<Vec<_>>()),
        format!("{:?}", found.fields().collect::<Vec<_>>())
    );
    assert_eq!(resolved.delivery.args_json, found.args_json);
    assert!(!resolve(&skipped, Resolution::Done), "settled already");
    assert!(matches!(
        claim(&store, &skipped).unwrap(),
        ClaimAnswer::Completed { .. }
    ));
    assert_eq!(find(&store, &skipped).resolution.as_deref(), Some("done"));
}

pub(crate) fn expiring_a_claim_makes_the_next_delivery_a_takeover(store: Store) {
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

pub(crate) fn a_heartbeat_keeps_a_long_claim_alive_and_stops_when_told(store: Store) {
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

pub(crate) fn a_heartbeat_stops_at_the_maximum_run_time_and_notices_a_lost_claim(store: Store) {
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

pub(crate) fn completion_and_release_repeat_safely_for_their_own_token(store: Store) {
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
