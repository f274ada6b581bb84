//! The operators' read-only lists (core/report.rs) against a real PostgreSQL
//! (DATABASE_URL). Each test uses its own job types, so tests run in parallel on one
//! database; lists that span job types are checked for what they must and must not
//! contain.

use std::time::Duration;

use chrono::Utc;
use common::claim::{self, ClaimAnswer, ClaimRequest, Fenced};
use idempotent_job_core::conn::Conn;
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::protocol::reclaim_budget_reason;
use idempotent_job_core::report;
use idempotent_job_core::store::Store;
use uuid::Uuid;

mod common;
use common::store;
use common::StoreExt;

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
        ClaimAnswer::Claimed { token, .. } => token,
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

#[test]
fn only_a_completed_operation_answers_completed() {
    let store = store();
    let job_type = unique("completed");
    let completed = |key: &str| {
        let (jt, key) = (job_type.clone(), key.to_string());
        run(&store, async move |c| claim::completed(c, &jt, &key).await).unwrap()
    };
    assert!(!completed("none"), "no record");
    for (key, fenced) in [
        ("claimed", None),
        ("completed", Some(Fenced::Complete)),
        ("released", Some(Fenced::Release)),
        ("held", Some(Fenced::Hold)),
        ("given_up", Some(Fenced::GiveUp)),
    ] {
        let req = request(&job_type, key, 30.0);
        let token = claim(&store, &req);
        if let Some(fenced) = fenced {
            change(&store, &req, fenced, token);
        }
    }
    assert!(completed("completed"));
    for key in ["claimed", "released", "held", "given_up"] {
        assert!(!completed(key), "{key} is not completed");
    }
    let stale = request(&job_type, "stale", 0.05);
    claim(&store, &stale);
    std::thread::sleep(Duration::from_millis(80));
    assert!(!completed("stale"), "a stale claim is not completed");
}

#[test]
fn metrics_count_each_status_claim_state_repeat_and_the_purge_backlog() {
    let store = store();
    let job_type = unique("metrics \"quoted\"\\");
    for key in ["done-1", "done-old", "held", "given-up", "released", "live"] {
        let req = request(&job_type, key, 30.0);
        let token = claim(&store, &req);
        match key {
            "done-1" | "done-old" => change(&store, &req, Fenced::Complete, token),
            "held" => change(&store, &req, Fenced::Hold, token),
            "given-up" => change(&store, &req, Fenced::GiveUp, token),
            "released" => change(&store, &req, Fenced::Release, token),
            _ => {}
        }
    }
    // Held by the reclaim budget (the reason the protocol stores), and counted apart.
    let budget = request(&job_type, "held-by-budget", 30.0);
    let token = claim(&store, &budget);
    let reason = reclaim_budget_reason(3, 2);
    run(&store, async |c| {
        let (job_type, key) = (&budget.job_type, &budget.operation_key);
        claim::fenced(c, Fenced::Hold, job_type, key, token, Some(&reason)).await
    })
    .unwrap();
    claim(&store, &request(&job_type, "stale", 0.05));
    std::thread::sleep(Duration::from_millis(80));
    let jt = job_type.clone();
    run(&store, async move |c| {
        // Backdated by hand: a record finished two hours ago, held for 90 s, and
        // repeats at three times (two of them within the hour) on two records.
        let sql = "UPDATE idempotent_job_records SET
             completed_at = CASE operation_key WHEN 'done-old' THEN now() - interval '2 hours' ELSE completed_at END,
             first_claimed_at = CASE operation_key WHEN 'done-old' THEN now() - interval '2 hours' ELSE first_claimed_at END,
             held_at = CASE operation_key WHEN 'held' THEN now() - interval '90 seconds' ELSE held_at END,
             repeat_times = CASE operation_key
                 WHEN 'done-1' THEN ARRAY[now() - interval '3 hours', now() - interval '10 minutes']::timestamptz[]
                 WHEN 'live' THEN ARRAY[now() - interval '1 minute']::timestamptz[]
                 ELSE repeat_times END
           WHERE job_type = $1";
        c.execute(sql, &[&jt]).await?;
        Ok(())
    })
    .unwrap();

    let rows = run(&store, async |c| report::metrics(c, 3600.0).await).unwrap();
    let ours = rows.iter().find(|r| r.job_type == job_type).unwrap();
    // claimed (live + stale), completed, released, held, given_up
    assert_eq!(ours.records, [2, 2, 1, 2, 1]);
    assert_eq!(ours.held_by_reclaim_budget, 1, "one of the two held");
    assert_eq!((ours.live_claims, ours.stale_claims), (1, 1));
    assert!(
        (90.0..120.0).contains(&ours.oldest_held_seconds),
        "held 90 s ago: {}",
        ours.oldest_held_seconds
    );
    assert_eq!(ours.repeats_last_hour, 2);
    assert_eq!(ours.repeated_operations_last_hour, 2);
    assert_eq!(
        ours.purge_backlog, 1,
        "only done-old is past a retention of 1 h"
    );
    let all = run(&store, async |c| report::metrics(c, 10_000.0).await).unwrap();
    let longer = all.iter().find(|r| r.job_type == job_type).unwrap();
    assert_eq!(longer.purge_backlog, 0, "nothing past a longer retention");

    let text = report::exposition(std::slice::from_ref(ours), 3600.0);
    let label = job_type.replace('\\', r"\\").replace('"', r#"\""#);
    for line in [
        format!("idempotent_job_records{{job_type=\"{label}\",status=\"held\"}} 2"),
        format!("idempotent_job_held_by_reclaim_budget{{job_type=\"{label}\"}} 1"),
        format!("idempotent_job_claims{{job_type=\"{label}\",state=\"stale\"}} 1"),
        format!("idempotent_job_purge_backlog{{job_type=\"{label}\"}} 1"),
        "idempotent_job_retention_seconds 3600".to_string(),
        "# TYPE idempotent_job_repeats_last_hour gauge".to_string(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
    assert!(matches!(
        run(&store, async |c| report::metrics(c, -1.0).await),
        Err(Error::Config(_))
    ));

    // The backlog is what a purge at the same retention deletes (every job type's).
    let backlog: i64 = run(&store, async |c| report::metrics(c, 3600.0).await)
        .unwrap()
        .iter()
        .map(|r| r.purge_backlog)
        .sum();
    let deleted = run(&store, async |c| {
        claim::purge_batch(c, 3600.0, 1_000_000, &claim::PurgeCursor::default()).await
    })
    .unwrap();
    assert_eq!(deleted.deleted as i64, backlog);
    let after = run(&store, async |c| report::metrics(c, 3600.0).await).unwrap();
    assert_eq!(after.iter().map(|r| r.purge_backlog).sum::<i64>(), 0);
}

/// `held` with a limit below 1 is refused in the core, stating the valid range, before
/// anything is sent. Before, -1 reached PostgreSQL ("LIMIT must not be negative",
/// SQLSTATE 2201W) and came back as a database error.
#[test]
fn held_refuses_a_limit_below_one() {
    let store = store();
    for limit in [-1, 0, i64::MIN] {
        let err = store
            .run(|pool, i| idempotent_job_core::operations::held(pool, i, None, limit))
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("held needs a limit of at least 1 (up to 9223372036854775807), got {limit}")
        );
    }
    assert!(store
        .run(|pool, i| idempotent_job_core::operations::held(pool, i, None, 1))
        .is_ok());
}

/// A timestamptz of 'infinity' edited into a record is a clear error naming the record
/// and the column (or the endless lease), not retryable: reading again reads the same
/// value. Before, `find` failed with a retryable connection error ("error deserializing
/// column …": sent again and again) and a claim meeting the endless lease with a
/// database error ("cannot subtract infinite timestamps", PostgreSQL before 17).
#[test]
fn a_timestamp_of_infinity_in_a_record_is_a_clear_error_never_retried() {
    let store = store();
    let job_type = unique("infinity");
    let req = request(&job_type, "k", 30.0);
    claim(&store, &req);
    common::Admin::new().exec(&format!(
        "UPDATE idempotent_job_records SET claimed_at = 'infinity', \
                lease_expires_at = 'infinity' WHERE job_type = '{job_type}'"
    ));
    let jt = job_type.clone();
    let err = store
        .run(|pool, i| idempotent_job_core::operations::find(pool, i, &jt, "k"))
        .unwrap_err();
    assert!(matches!(err, Error::Unreadable(_)), "{err:?}");
    assert_eq!(err.class_name(), "UnreadableRecordError");
    assert!(!err.retryable());
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "the record of {job_type} operation \"k\" cannot be read: its column claimed_at"
        )),
        "{text}"
    );
    let err = store
        .run(|pool, i| claim::deliver(pool, i, &req))
        .unwrap_err();
    // The endless lease is the same family as an unreadable column: the record and the
    // column are named, the class is UnreadableRecordError (a ConfigurationError).
    assert!(matches!(err, Error::Unreadable(_)), "{err:?}");
    assert_eq!(err.class_name(), "UnreadableRecordError");
    assert!(!err.retryable());
    assert!(
        err.to_string().contains(&format!(
            "the record of {job_type} operation \"k\" holds a claim whose lease never ends: \
             its column lease_expires_at is 'infinity'"
        )),
        "{err}"
    );
}
