//! The operators' read-only lists (core/report.rs) against a real PostgreSQL
//! (DATABASE_URL). Each test uses its own job types, so tests run in parallel on one
//! database; lists that span job types are checked for what they must and must not
//! contain.

use std::time::Duration;

use chrono::Utc;
use idempotent_job_core::claim::{self, ClaimRequest, Fenced, Outcome};
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::report;
use idempotent_job_core::store::{Conn, Store};
use uuid::Uuid;

mod common;
use common::store;

fn request(job_type: &str, key: &str, lease: f64) -> ClaimRequest {
    ClaimRequest {
        job_type: job_type.into(),
        operation_key: key.into(),
        lease_seconds: lease,
        ..ClaimRequest::default()
    }
}

fn unique(name: &str) -> String {
    format!("{name}-{}", Uuid::new_v4())
}

/// Runs `op` on a pooled connection of `store`.
fn run<T>(store: &Store, op: impl AsyncFnOnce(&mut Conn) -> Result<T>) -> Result<T> {
    store.with_conn(op)
}

/// Claims `req` and returns its token.
fn claim(store: &Store, req: &ClaimRequest) -> Uuid {
    let req = req.clone();
    match run(store, async move |c| claim::claim(c, &req).await)
        .unwrap()
        .outcome
    {
        Outcome::Claimed { token, .. } => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn change(store: &Store, req: &ClaimRequest, change: Fenced, token: Uuid) {
    let req = req.clone();
    run(store, async move |c| {
        claim::fenced(c, change, &req.job_type, &req.operation_key, token, None).await
    })
    .unwrap();
}

fn keys(job_type: &str, operation_keys: &[&str]) -> report::Keys {
    operation_keys
        .iter()
        .map(|k| (job_type.to_string(), k.to_string()))
        .collect()
}

#[test]
fn given_up_operations_are_listed_newest_first_and_only_those() {
    let store = store();
    let job_type = unique("given-up");
    for key in ["1", "2", "3"] {
        let req = request(&job_type, key, 30.0);
        let token = claim(&store, &req);
        match key {
            "3" => change(&store, &req, Fenced::Hold, token),
            _ => change(&store, &req, Fenced::GiveUp, token),
        }
    }
    let jt = job_type.clone();
    let listed = run(&store, async move |c| {
        report::given_up(c, Some(&jt), 10).await
    })
    .unwrap();
    assert_eq!(listed, keys(&job_type, &["2", "1"]));

    let all = run(&store, async move |c| {
        report::given_up(c, None, 100_000).await
    })
    .unwrap();
    assert!(all.contains(&(job_type.clone(), "1".into())));
    assert!(
        !all.contains(&(job_type.clone(), "3".into())),
        "held is not given up"
    );
    let jt = job_type.clone();
    let one = run(&store, async move |c| {
        report::given_up(c, Some(&jt), 1).await
    })
    .unwrap();
    assert_eq!(one, keys(&job_type, &["2"]));
}

#[test]
fn a_search_narrows_by_job_type_key_prefix_and_status() {
    let store = store();
    let job_type = unique("search");
    let other = unique("search-other");
    for key in ["order-1", "order-2", "refund-1"] {
        let req = request(&job_type, key, 30.0);
        let token = claim(&store, &req);
        if key == "order-2" {
            change(&store, &req, Fenced::Complete, token);
        }
    }
    claim(&store, &request(&other, "order-1", 30.0));

    let search = |prefix: Option<&str>, status: Option<&str>| {
        let (jt, prefix, status) = (
            job_type.clone(),
            prefix.map(String::from),
            status.map(String::from),
        );
        run(&store, async move |c| {
            report::search(c, &jt, prefix.as_deref(), status.as_deref(), 50).await
        })
    };
    let mut all = search(None, None).unwrap();
    all.sort();
    assert_eq!(all, keys(&job_type, &["order-1", "order-2", "refund-1"]));
    assert_eq!(
        search(Some("order-"), Some("claimed")).unwrap(),
        keys(&job_type, &["order-1"])
    );
    assert_eq!(
        search(Some("order-"), None).unwrap().len(),
        2,
        "a prefix match, not a pattern"
    );
    assert_eq!(search(Some("%"), None).unwrap(), vec![]);
    assert!(matches!(
        search(None, Some("finished")),
        Err(Error::Config(m)) if m.contains("unknown record status \"finished\"")
    ));
    let empty = run(&store, async move |c| {
        report::search(c, "", None, None, 5).await
    });
    assert!(matches!(empty, Err(Error::Config(_))));
}

#[test]
fn a_takeover_is_listed_and_a_stale_claim_until_it_is_taken_over() {
    let store = store();
    let job_type = unique("takeover");
    let req = request(&job_type, "1", 0.05);
    claim(&store, &req);
    std::thread::sleep(Duration::from_millis(120));

    let stale = || run(&store, async |c| report::stale_claims(c, 100_000).await).unwrap();
    let key = (job_type.clone(), "1".to_string());
    assert!(stale().contains(&key), "an expired lease is a stale claim");

    let before = Utc::now() - chrono::Duration::seconds(60);
    let taken = claim(&store, &request(&job_type, "1", 30.0));
    change(&store, &req, Fenced::Complete, taken);
    assert!(!stale().contains(&key), "taken over, no longer stale");
    let listed = run(&store, async move |c| {
        report::takeovers(c, before, 100_000).await
    })
    .unwrap();
    assert!(listed.contains(&key));

    let later = Utc::now() + chrono::Duration::seconds(60);
    let none = run(&store, async move |c| {
        report::takeovers(c, later, 100_000).await
    })
    .unwrap();
    assert!(!none.contains(&key), "only takeovers since the given time");
}

#[test]
fn job_types_are_listed_once_each_in_order() {
    let store = store();
    let prefix = unique("types");
    for job_type in [format!("{prefix}-b"), format!("{prefix}-a")] {
        for key in ["1", "2"] {
            claim(&store, &request(&job_type, key, 30.0));
        }
    }
    let types = run(&store, async |c| report::job_types(c, 100_000).await).unwrap();
    let ours: Vec<_> = types.iter().filter(|t| t.starts_with(&prefix)).collect();
    assert_eq!(ours, vec![&format!("{prefix}-a"), &format!("{prefix}-b")]);
    let mut distinct = types.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), types.len(), "each job type once");
    assert!(matches!(
        run(&store, async |c| report::job_types(c, 0).await),
        Err(Error::Config(_))
    ));
}
