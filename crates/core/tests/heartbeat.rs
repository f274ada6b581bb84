//! The one heartbeat timer of a process (`idempotent_job_core::heartbeat::Timer`)
//! against a real PostgreSQL (DATABASE_URL): many claims renewed by one task, each
//! stopping on its own. Waits are for conditions (with a generous bound), never for a
//! time: the assertions do not depend on the machine's speed.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::claim::{self, ClaimAnswer, ClaimRequest};
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::heartbeat::{self, Heartbeat};
use idempotent_job_core::store::Store;

mod common;
use common::StoreExt;
use common::{store_in, store_with};

/// Waits until `done` holds, at most `bound` (then fails saying `what`).
fn wait_until(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + bound;
    while !done() {
        assert!(Instant::now() < until, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Claims `n` fresh operations of `job_type` with `lease` seconds: their requests and tokens.
fn claims(store: &Store, job_type: &str, n: usize, lease: f64) -> Vec<(ClaimRequest, uuid::Uuid)> {
    (0..n)
        .map(|k| {
            let req = ClaimRequest {
                job_type: job_type.into(),
                operation_key: k.to_string(),
                delivery_id: Some(format!("jid-{k}")),
                lease_seconds: lease,
                ..ClaimRequest::default()
            };
            let decision = store.run(|pool, i| claim::deliver(pool, i, &req)).unwrap();
            let ClaimAnswer::Claimed { token, .. } = decision.outcome else {
                panic!("expected a claim, got {decision:?}");
            };
            (req, token)
        })
        .collect()
}

/// `heartbeat_at` of each operation, in order.
fn heartbeat_times(
    store: &Store,
    claims: &[(ClaimRequest, uuid::Uuid)],
) -> Vec<Option<DateTime<Utc>>> {
    claims
        .iter()
        .map(|(req, _)| {
            store
                .with_conn(async |c| claim::find(c, &req.job_type, &req.operation_key).await)
                .unwrap()
                .unwrap()
                .heartbeat_at
        })
        .collect()
}

#[test]
fn one_timer_renews_many_claims_and_stops_with_each() {
    let store = store_with(true, 4);
    let pool = store.pool().unwrap();
    let job_type = format!("HeartbeatTimer-{}", uuid::Uuid::new_v4());
    // A lease of 3 s: renewed about every second.
    let claims = claims(&store, &job_type, 40, 3.0);
    let timer = pool.heartbeats().clone();
    assert_eq!((timer.live(), timer.tasks()), (0, 0));
    let beats: Vec<Heartbeat> = claims
        .iter()
        .map(|(req, token)| {
            pool.heartbeat(
                req.job_type.clone(),
                req.operation_key.clone(),
                *token,
                3.0,
                600.0,
            )
        })
        .collect();
    assert_eq!(
        (timer.live(), timer.tasks()),
        (40, 1),
        "one task for 40 claims"
    );
    wait_until(
        "every claim renewed twice",
        Duration::from_secs(120),
        || beats.iter().all(|b| b.report().renewals >= 2),
    );
    assert!(heartbeat_times(&store, &claims).iter().all(Option::is_some));
    assert!(beats.iter().all(|b| b.report().failures == 0));

    // Stop every other claim: the timer keeps renewing the rest, and only them.
    let (stopped, running): (Vec<_>, Vec<_>) =
        beats.into_iter().enumerate().partition(|(k, _)| k % 2 == 0);
    let counts: Vec<u64> = stopped.iter().map(|(_, b)| b.stop().renewals).collect();
    assert_eq!(timer.live(), 20);
    let at_stop: Vec<u64> = running.iter().map(|(_, b)| b.report().renewals).collect();
    let renewed_twice_more = |base: &[u64]| {
        running
            .iter()
            .zip(base)
            .all(|((_, b), n)| b.report().renewals >= n + 2)
    };
    // By then a renewal of a stopped claim already under way has landed.
    wait_until(
        "the running claims renewed twice more",
        Duration::from_secs(120),
        || renewed_twice_more(&at_stop),
    );
    let stopped_claims: Vec<_> = stopped.iter().map(|(k, _)| claims[*k].clone()).collect();
    let settled = heartbeat_times(&store, &stopped_claims);
    let base: Vec<u64> = running.iter().map(|(_, b)| b.report().renewals).collect();
    wait_until(
        "the running claims renewed twice more again",
        Duration::from_secs(120),
        || renewed_twice_more(&base),
    );
    assert_eq!(
        heartbeat_times(&store, &stopped_claims),
        settled,
        "a stopped claim was renewed"
    );
    let after: Vec<u64> = stopped.iter().map(|(_, b)| b.report().renewals).collect();
    assert_eq!(after, counts, "a stopped heartbeat counted a renewal");

    // Dropping a heartbeat stops it too; the timer task stays for the next claims.
    drop(running);
    assert_eq!((timer.live(), timer.tasks()), (0, 1));
    let more = self::claims(&store, &format!("{job_type}-more"), 1, 3.0);
    let beat = pool.heartbeat(
        more[0].0.job_type.clone(),
        more[0].0.operation_key.clone(),
        more[0].1,
        3.0,
        600.0,
    );
    assert_eq!((timer.live(), timer.tasks()), (1, 1));
    wait_until("the new claim renewed", Duration::from_secs(120), || {
        beat.report().renewals >= 1
    });
    beat.stop();
    assert_eq!(timer.live(), 0);
}

#[test]
fn a_shorter_lease_wakes_the_timer_early() {
    let store = store_with(true, 4);
    let pool = store.pool().unwrap();
    let job_type = format!("HeartbeatTimer-{}", uuid::Uuid::new_v4());
    let long = claims(&store, &format!("{job_type}-long"), 1, 600.0);
    let short = claims(&store, &format!("{job_type}-short"), 1, 1.5);
    // The timer sleeps until the long claim's renewal (200 s away)...
    let slow = pool.heartbeat(
        long[0].0.job_type.clone(),
        long[0].0.operation_key.clone(),
        long[0].1,
        600.0,
        3600.0,
    );
    // ...and a claim due in 0.5 s must still be renewed in time.
    let fast = pool.heartbeat(
        short[0].0.job_type.clone(),
        short[0].0.operation_key.clone(),
        short[0].1,
        1.5,
        3600.0,
    );
    wait_until(
        "the short claim renewed 3 times",
        Duration::from_secs(100),
        || fast.report().renewals >= 3,
    );
    assert_eq!(slow.report().renewals, 0);
    assert_eq!(pool.heartbeats().tasks(), 1);
}

#[test]
fn a_failed_renewal_rings_the_alarm_a_host_waits_on() {
    let schema = format!("alarm_{}", uuid::Uuid::new_v4().simple());
    let store = store_in(&schema);
    let pool = store.pool().unwrap();
    let job_type = format!("HeartbeatAlarm-{}", uuid::Uuid::new_v4());
    let claimed = claims(&store, &job_type, 1, 1.5);
    let none = Interrupt::none();
    let rings = heartbeat::alarm_rings();
    // Nothing failed: a bounded wait ends with the rings unchanged.
    let soon = Instant::now() + Duration::from_millis(50);
    assert_eq!(
        heartbeat::wait_for_alarm(rings, Some(soon), &none).unwrap(),
        rings
    );
    // Renewals succeed: no ring while the claim is renewed twice.
    let beat = pool.heartbeat(job_type.clone(), "0".into(), claimed[0].1, 1.5, 600.0);
    wait_until("two renewals", Duration::from_secs(60), || {
        beat.report().renewals >= 2
    });
    assert_eq!(
        heartbeat::alarm_rings(),
        rings,
        "a renewal that succeeded rang"
    );
    // The table goes away: the next renewal fails (neither renewed nor lost) and rings;
    // the waiter wakes without a bound (another test's failure could ring first: wait
    // again until this heartbeat's failure is counted).
    common::drop_schema(&schema);
    let mut seen = rings;
    let until = Instant::now() + Duration::from_secs(60);
    while beat.report().failures == 0 {
        assert!(Instant::now() < until, "no failed renewal within 60 s");
        seen = heartbeat::wait_for_alarm(seen, Some(until), &none).unwrap();
    }
    assert!(seen > rings, "the failed renewal did not ring the alarm");
    assert!(!beat.report().lost);
    // Already rung past `rings`: a waiter that saw less returns at once.
    assert!(heartbeat::wait_for_alarm(rings, None, &none).unwrap() > rings);
}
