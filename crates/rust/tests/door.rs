//! The Rust door against real PostgreSQL (DATABASE_URL from `bin/services start`):
//! sequential repeats, concurrent copies from tasks and from processes, a SIGKILLed
//! process under each stale policy, a raising body, the lookup; each scenario's effects
//! counted in a table of their own, written by the body's own connection.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotent_job_rust::{
    ClaimKind, Config, Decision, IdempotentJob, LookupAnswer, OnStale, Rerun, Resolution,
};

fn url() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL (bin/services start)")
}

fn scenario() -> String {
    format!("r{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

async fn db() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        // Tests run on parallel threads: CREATE TABLE IF NOT EXISTS from two sessions at
        // once can both pass the existence check and one fail on pg_type's unique index,
        // so creators take one advisory lock for the transaction.
        .batch_execute(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('rust_test_effects')); \
             CREATE TABLE IF NOT EXISTS rust_test_effects (scenario text, key text, pid int); \
             COMMIT",
        )
        .await
        .unwrap();
    client
}

async fn effect(scenario: &str, key: &str) {
    db().await
        .execute(
            "INSERT INTO rust_test_effects VALUES ($1, $2, $3)",
            &[&scenario, &key, &(std::process::id() as i32)],
        )
        .await
        .unwrap();
}

async fn effects(scenario: &str) -> i64 {
    db().await
        .query_one(
            "SELECT count(*) FROM rust_test_effects WHERE scenario = $1",
            &[&scenario],
        )
        .await
        .unwrap()
        .get(0)
}

async fn jobs() -> IdempotentJob {
    let jobs = IdempotentJob::configure(Config::new(url())).unwrap();
    jobs.migrate().await.unwrap();
    jobs
}

#[tokio::test]
async fn sequential_repeats_run_once_and_replay_the_value() {
    let s = scenario();
    let jobs = jobs().await;
    let charge = jobs.job("RustCharge").store_result(true).build().unwrap();
    let mut decisions = vec![];
    for _ in 0..3 {
        let s2 = s.clone();
        let outcome = charge
            .perform_once(s.clone(), |claim| async move {
                effect(&s2, &claim.operation_key).await;
                Ok::<_, std::io::Error>(format!("charged {}", claim.operation_key))
            })
            .await
            .unwrap();
        assert_eq!(
            outcome.value.as_deref(),
            Some(format!("charged {s}").as_str())
        );
        decisions.push((outcome.decision.as_str(), outcome.replayed));
    }
    assert_eq!(
        decisions,
        [("ran", false), ("completed", true), ("completed", true)]
    );
    assert_eq!(effects(&s).await, 1);
}

#[tokio::test]
async fn a_stored_result_that_is_no_t_is_an_error_not_a_replay_without_a_value() {
    // The first run stored a String; a repeat asking for a u64 (a changed result type,
    // another language's run) is refused naming the record, not answered `replayed` with
    // no value (Ruby and Python read every stored result back). The body is not run.
    let s = scenario();
    let jobs = jobs().await;
    let charge = jobs
        .job("RustChargeTyped")
        .store_result(true)
        .build()
        .unwrap();
    let first = charge
        .perform_once(s.clone(), |_| async {
            Ok::<_, std::io::Error>("ch_1".to_string())
        })
        .await
        .unwrap();
    assert!(first.ran());
    let s2 = s.clone();
    let again = charge
        .perform_once(s.clone(), |claim| async move {
            effect(&s2, &claim.operation_key).await;
            Ok::<_, std::io::Error>(7u64)
        })
        .await;
    match again {
        Err(idempotent_job_rust::PerformError::Core(e)) => {
            assert_eq!(e.class_name(), "UnreadableRecordError", "{e}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("RustChargeTyped operation \"{s}\"")),
                "{text}"
            );
            assert!(text.contains("u64"), "{text}");
        }
        other => panic!("expected an UnreadableRecordError, got {other:?}"),
    }
    assert_eq!(effects(&s).await, 0);
}

#[tokio::test]
async fn without_the_door_repeats_run_again() {
    let s = scenario();
    for _ in 0..3 {
        effect(&s, "A").await;
    }
    assert_eq!(effects(&s).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_copies_from_tasks_run_once() {
    let s = scenario();
    let charge = jobs().await.job("RustConcurrent").build().unwrap();
    let copies = (0..5).map(|_| {
        let (charge, s) = (charge.clone(), s.clone());
        tokio::spawn(async move {
            charge
                .perform_once(s.clone(), |_| async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    effect(&s, "A").await;
                    Ok::<_, std::io::Error>(())
                })
                .await
                .unwrap()
                .decision
        })
    });
    let mut decisions = vec![];
    for copy in copies {
        decisions.push(copy.await.unwrap());
    }
    assert_eq!(
        decisions.iter().filter(|d| **d == Decision::Ran).count(),
        1,
        "{decisions:?}"
    );
    assert!(decisions.iter().all(|d| matches!(
        d,
        Decision::Ran | Decision::InProgress | Decision::Completed
    )));
    assert_eq!(effects(&s).await, 1);
}

#[tokio::test]
async fn a_raising_body_releases_and_the_next_delivery_runs_it() {
    let s = scenario();
    let charge = jobs().await.job("RustRaise").build().unwrap();
    let failed = charge
        .perform_once(s.clone(), |_| async {
            Err::<(), _>(std::io::Error::other("gateway down"))
        })
        .await;
    assert!(
        matches!(failed, Err(idempotent_job_rust::PerformError::Body(ref e)) if e.to_string() == "gateway down")
    );
    let s2 = s.clone();
    let outcome = charge
        .perform_once(s.clone(), |claim| async move {
            assert_eq!(claim.attempt, 2);
            effect(&s2, "A").await;
            Ok::<_, std::io::Error>(())
        })
        .await
        .unwrap();
    assert!(outcome.ran());
    assert_eq!(effects(&s).await, 1);
}

#[tokio::test]
async fn bad_keys_and_options_are_refused_by_name() {
    let jobs = jobs().await;
    let err = jobs.job("RustBad").lease(0.0).build().err().unwrap();
    assert!(err.to_string().contains("RustBad: lease must be"), "{err}");
    let job = jobs.job("RustBad").build().unwrap();
    let err = job
        .perform_once(serde_json::json!(1.5), |_| async {
            Ok::<_, std::io::Error>(())
        })
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .starts_with("OperationKeyError: RustBad: operation key"),
        "{err}"
    );
}

// --- processes: the test binary runs itself as a child (IDEMPOTENT_JOB_CHILD set) ---

/// A child process's delivery:
/// `IDEMPOTENT_JOB_CHILD=scenario:job:sleep_ms:on_stale[:max_takeovers]`.
#[tokio::test]
async fn child() {
    let Ok(spec) = std::env::var("IDEMPOTENT_JOB_CHILD") else {
        return;
    };
    let parts: Vec<String> = spec.split(':').map(str::to_string).collect();
    let (s, job, sleep_ms) = (
        parts[0].clone(),
        parts[1].clone(),
        parts[2].parse::<u64>().unwrap(),
    );
    let policy = match parts[3].as_str() {
        "hold" => OnStale::Hold,
        _ => OnStale::Reclaim,
    };
    let mut job = jobs().await.job(job).lease(2.0).on_stale(policy);
    if let Some(max) = parts.get(4) {
        job = job.max_takeovers(max.parse().unwrap());
    }
    let job = job.build().unwrap();
    let outcome = job
        .perform_once(s.clone(), |_| async move {
            effect(&s, "A").await;
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            Ok::<_, std::io::Error>(())
        })
        .await
        .unwrap();
    println!("decision={}", outcome.decision.as_str());
}

fn spawn_child(s: &str, job: &str, sleep_ms: u64, policy: &str) -> std::process::Child {
    spawn_child_with(s, job, sleep_ms, policy)
}

/// [`spawn_child`] with the child spec's policy part (`on_stale[:max_takeovers]`).
fn spawn_child_with(s: &str, job: &str, sleep_ms: u64, policy: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(
            "IDEMPOTENT_JOB_CHILD",
            format!("{s}:{job}:{sleep_ms}:{policy}"),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn concurrent_copies_from_processes_run_once() {
    let s = scenario();
    jobs().await;
    let children: Vec<_> = (0..4)
        .map(|_| spawn_child(&s, "RustProcs", 500, "reclaim"))
        .collect();
    let mut ran = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        ran += String::from_utf8_lossy(&out.stdout)
            .matches("decision=ran")
            .count();
    }
    assert_eq!(ran, 1);
    assert_eq!(effects(&s).await, 1);
}

async fn killed_then_delivered(policy: &str, stale: OnStale) -> (String, Decision) {
    let s = scenario();
    let jobs = jobs().await;
    let mut child = spawn_child(&s, "RustKilled", 60_000, policy);
    for _ in 0..300 {
        if effects(&s).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(effects(&s).await, 1, "the child's body never started");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let job = jobs
        .job("RustKilled")
        .lease(2.0)
        .on_stale(stale)
        .build()
        .unwrap();
    let mut deferrals = 0;
    loop {
        let s2 = s.clone();
        let outcome = job
            .delivery(s.clone())
            .deferrals(deferrals)
            .run(|_| async move {
                effect(&s2, "A").await;
                Ok::<_, std::io::Error>(())
            })
            .await
            .unwrap();
        if outcome.decision != Decision::InProgress {
            return (s, outcome.decision);
        }
        deferrals += 1;
        tokio::time::sleep(Duration::from_secs_f64(outcome.retry_after.unwrap())).await;
    }
}

#[tokio::test]
async fn a_killed_process_is_taken_over_under_reclaim() {
    let (s, decision) = killed_then_delivered("reclaim", OnStale::Reclaim).await;
    assert_eq!(decision, Decision::Ran);
    assert_eq!(effects(&s).await, 2); // the rare duplicate reclaim accepts
}

async fn status(job: &str, key: &str) -> String {
    db().await
        .query_one(
            "SELECT status FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2",
            &[&job, &key],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_held_operation_resolved_for_a_rerun_goes_to_the_registered_sender() {
    // Held after its process was SIGKILLed past the effect; resolve(Rerun) hands the
    // stored delivery to the sender the service registered, and that delivery runs once,
    // as a retry. Control: with no sender the record is only released.
    let (s, decision) = killed_then_delivered("hold", OnStale::Hold).await;
    assert_eq!(decision, Decision::Held);
    let jobs = jobs().await;
    let held = jobs.held(Some("RustKilled"), 10_000).await.unwrap();
    assert!(held.contains(&("RustKilled".to_string(), s.clone())));
    let sent = Arc::new(Mutex::new(Vec::<Rerun>::new()));
    let into = sent.clone();
    let scope = s.clone();
    jobs.on_rerun(move |rerun| {
        rerun.operation_key == scope && {
            into.lock().unwrap().push(rerun.clone());
            true
        }
    });
    assert!(jobs
        .resolve("RustKilled", s.clone(), Resolution::Rerun)
        .await
        .unwrap());
    assert!(!jobs
        .resolve("RustKilled", s.clone(), Resolution::Rerun)
        .await
        .unwrap());
    let rerun = sent
        .lock()
        .unwrap()
        .pop()
        .expect("the sender got the rerun");
    assert_eq!(
        (rerun.job_type.as_str(), rerun.operation_key.as_str()),
        ("RustKilled", s.as_str())
    );
    let job = jobs
        .job("RustKilled")
        .lease(2.0)
        .on_stale(OnStale::Hold)
        .build()
        .unwrap();
    let s2 = s.clone();
    let outcome = job
        .perform_once(rerun.operation_key.clone(), |_| async move {
            effect(&s2, "A").await;
            Ok::<_, std::io::Error>(())
        })
        .await
        .unwrap();
    assert_eq!(outcome.decision, Decision::Ran);
    assert_eq!(outcome.claim.unwrap().kind, ClaimKind::Retry);
    assert_eq!(effects(&s).await, 2);

    let (other, decision) = killed_then_delivered("hold", OnStale::Hold).await;
    assert_eq!(decision, Decision::Held);
    assert!(jobs
        .resolve("RustKilled", other.clone(), Resolution::Rerun)
        .await
        .unwrap());
    assert_eq!(status("RustKilled", &other).await, "released");
}

#[tokio::test]
async fn a_killed_process_is_held_under_hold() {
    let (s, decision) = killed_then_delivered("hold", OnStale::Hold).await;
    assert_eq!(decision, Decision::Held);
    assert_eq!(effects(&s).await, 1);
}

#[tokio::test]
async fn the_lookup_decides_after_a_takeover() {
    let s = scenario();
    let jobs = jobs().await;
    let mut child = spawn_child(&s, "RustLookup", 60_000, "reclaim");
    for _ in 0..300 {
        if effects(&s).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await; // the lease (2 s) runs out
    let job = jobs
        .job("RustLookup")
        .lease(2.0)
        .lookup("lookup charges")
        .build()
        .unwrap();
    let asked = s.clone();
    let outcome = job
        .delivery(s.clone())
        .run_looking_up(
            move |key| async move {
                assert_eq!(key, asked);
                LookupAnswer::Done
            },
            |_| async { Ok::<_, std::io::Error>(()) },
        )
        .await
        .unwrap();
    assert_eq!(outcome.decision, Decision::Completed);
    assert_eq!(effects(&s).await, 1);
}

/// One delivery of `s` in a child process (job RustPoison, lease 2 s, child spec
/// `policy`) whose body never ends: SIGKILLed as soon as its effect is written, as a
/// body that kills its worker (out of memory, a segfault). `None` when it was killed;
/// else the decision the child printed (its body did not run).
async fn poison_delivery(s: &str, policy: &str) -> Option<String> {
    let before = effects(s).await;
    let mut child = spawn_child_with(s, "RustPoison", 60_000, policy);
    for _ in 0..600 {
        if effects(s).await > before {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            return None;
        }
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            let out = String::from_utf8_lossy(&out.stdout).to_string();
            // The test harness prints `test child ... ` before the child's own line.
            let decision = out
                .lines()
                .find_map(|l| l.split_once("decision=").map(|(_, d)| d.trim()));
            let decision = decision.unwrap_or_else(|| panic!("no decision printed: {out}"));
            return Some(decision.to_string());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the child neither ran its body nor ended within 30 s");
}

/// Waits (at most 10 s) for the lease of `s`'s RustPoison claim to run out.
async fn lease_ended(s: &str) {
    for _ in 0..200 {
        let ended: bool = db()
            .await
            .query_one(
                "SELECT lease_expires_at <= now() FROM idempotent_job_records \
                  WHERE job_type = 'RustPoison' AND operation_key = $1",
                &[&s],
            )
            .await
            .unwrap()
            .get(0);
        if ended {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the killed claim's lease never ran out");
}

#[tokio::test]
async fn a_body_that_kills_its_process_every_time_is_held_after_max_takeovers() {
    // Issue 34: under `reclaim` with max_takeovers(1), the first run and one takeover run
    // (each SIGKILLed); the second stale claim is held for a person, with the reason.
    // Control: without the budget the third delivery takes over and runs again.
    jobs().await;
    for (policy, budget) in [("reclaim:1", true), ("reclaim", false)] {
        let s = scenario();
        let mut decisions = Vec::new();
        for _ in 0..3 {
            decisions.push(poison_delivery(&s, policy).await);
            if decisions.last().unwrap().is_none() {
                lease_ended(&s).await;
            }
        }
        if !budget {
            assert_eq!(decisions, [None, None, None]);
            assert_eq!(effects(&s).await, 3);
            continue;
        }
        assert_eq!(decisions, [None, None, Some("held".to_string())]);
        assert_eq!(effects(&s).await, 2);
        assert_eq!(status("RustPoison", &s).await, "held");
        let why: String = db()
            .await
            .query_one(
                "SELECT last_error FROM idempotent_job_records \
                  WHERE job_type = 'RustPoison' AND operation_key = $1",
                &[&s],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            why.starts_with("the reclaim budget is spent: 2 stale takeovers"),
            "{why}"
        );
    }
}

/// The fresh-clone trial found `wait(-1.0)` accepted and the body run; every binding
/// refuses a wait outside 0 to ten years before anything is claimed.
#[tokio::test]
async fn a_wait_outside_zero_to_ten_years_is_refused_before_anything_runs() {
    let s = scenario();
    let charge = jobs().await.job("RustWaitRange").build().unwrap();
    for wait in [-1.0, f64::NAN, 1e300] {
        let s2 = s.clone();
        let run = charge
            .delivery(s.clone())
            .wait(wait)
            .run(|claim| async move {
                effect(&s2, &claim.operation_key).await;
                Ok::<_, std::io::Error>(())
            })
            .await;
        let Err(refused) = run else {
            panic!("a wait of {wait} was accepted")
        };
        let text = refused.to_string();
        assert!(
            text.contains("RustWaitRange: wait must be a number of seconds from 0"),
            "{text}"
        );
    }
    assert_eq!(effects(&s).await, 0);
    let outcome = charge
        .delivery(s.clone())
        .wait(0.5)
        .run(|_| async { Ok::<_, std::io::Error>(()) })
        .await
        .unwrap();
    assert_eq!(outcome.decision, Decision::Ran);
}
