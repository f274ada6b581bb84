//! The conformance vectors (conformance/vectors.json, docs/conformance.md) through the
//! Rust door: its operation keys and refusals, and every decision case delivered by
//! `Delivery::run` on PostgreSQL (DATABASE_URL from `bin/services start`). The core's
//! cargo tests, the Ruby specs and the Python tests read the same file.

use idempotent_job_rust::{
    operation_key, Config, Error, IdempotentJob, LookupAnswer, OnMismatch, OnStale, PerformError,
};
use serde_json::{json, Value};

fn url() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL (bin/services start)")
}

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conformance/vectors.json"
    );
    let vectors: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(vectors["format"], 1, "a vectors format this test reads");
    vectors
}

fn cases<'a>(vectors: &'a Value, section: &str) -> &'a Vec<Value> {
    vectors[section]["cases"].as_array().unwrap()
}

fn text<'a>(case: &'a Value, field: &str) -> &'a str {
    case[field].as_str().unwrap()
}

#[test]
fn operation_keys_and_refusals() {
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in cases(&vectors, "keys") {
        let value: Value = serde_json::from_str(text(case, "json")).unwrap();
        let got = operation_key(case["job_type"].as_str().unwrap_or("Job"), value);
        let ok = match (&got, case.get("refused")) {
            (Ok(key), None) => case["text"] == *key,
            (Err(e @ Error::OperationKey { .. }), Some(Value::String(fragment))) => {
                e.to_string().contains(fragment.as_str())
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{}: got {got:?}", case["name"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const JOB: &str = "ConformanceJob";

fn answer(name: &str) -> LookupAnswer {
    match name {
        "done" => LookupAnswer::Done,
        "not_done" => LookupAnswer::NotDone,
        _ => LookupAnswer::Unknown,
    }
}

/// One delivery through the door, in the vectors' terms (without `status_after`).
async fn deliver(jobs: &IdempotentJob, key: &str, payload: &Value, options: &Value) -> Value {
    let on_stale = match text(options, "on_stale") {
        "reclaim" => OnStale::Reclaim,
        "hold" => OnStale::Hold,
        _ => OnStale::Skip,
    };
    let on_mismatch = match text(options, "on_mismatch") {
        "raise" => OnMismatch::Raise,
        _ => OnMismatch::Log,
    };
    let lookup = options["lookup"].as_str().map(str::to_string);
    let mut builder = jobs
        .job(JOB)
        .on_stale(on_stale)
        .on_mismatch(on_mismatch)
        .heartbeat(false);
    if lookup.is_some() {
        builder = builder.lookup("lookup");
    }
    let job = builder.build().unwrap();
    let delivery = job.delivery(key).payload(payload.clone());
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let body = {
        let ran = ran.clone();
        move |_claim| async move {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        }
    };
    let outcome = match lookup {
        Some(name) => {
            let asked = asked.clone();
            delivery
                .run_looking_up(
                    move |_key| async move {
                        asked.store(true, std::sync::atomic::Ordering::SeqCst);
                        answer(&name)
                    },
                    body,
                )
                .await
        }
        None => delivery.run(body).await,
    };
    let flag = |b: &std::sync::Arc<std::sync::atomic::AtomicBool>| {
        b.load(std::sync::atomic::Ordering::SeqCst)
    };
    match outcome {
        Ok(o) => json!({
            "decision": o.decision.as_str(), "error": null, "ran": flag(&ran),
            "claim": o.claim.map(|c| c.kind.as_str()), "lookup_asked": flag(&asked),
            "duplicates": o.duplicates, "retry_after": o.retry_after,
        }),
        Err(PerformError::Core(Error::PayloadMismatch { .. })) => json!({
            "decision": null, "error": "payload_mismatch", "ran": flag(&ran), "claim": null,
            "lookup_asked": flag(&asked), "duplicates": null, "retry_after": null,
        }),
        Err(other) => panic!("{key}: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_case_through_the_door() {
    let vectors = vectors();
    let section = &vectors["decisions"];
    let jobs = IdempotentJob::configure(Config::new(url())).unwrap();
    jobs.migrate().await.unwrap();
    let (db, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let plain = json!({"on_stale": "reclaim", "on_mismatch": "log", "lookup": null});
    let mut failures = Vec::new();
    for case in cases(&vectors, "decisions") {
        let key = format!("conformance-{}", uuid::Uuid::new_v4());
        let record = text(case, "record");
        if record != "absent" {
            let first = deliver(&jobs, &key, &section["payload_a"], &plain).await;
            assert_eq!(first["decision"], "ran", "setup of {}", case["name"]);
            let setup = &section["setup"][record];
            let changed = db
                .execute(
                    text(section, "setup_sql"),
                    &[
                        &JOB,
                        &key,
                        &text(setup, "status"),
                        &setup["lease_expires_in"].as_f64().unwrap(),
                    ],
                )
                .await
                .unwrap();
            assert_eq!(changed, 1);
        }
        let payload = match text(case, "payload") {
            "same" => &section["payload_a"],
            _ => &section["payload_b"],
        };
        let mut got = deliver(&jobs, &key, payload, &case["options"]).await;
        jobs.settle().await.unwrap();
        let status: Option<String> = db
            .query_opt(
                "SELECT status FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2",
                &[&JOB, &key],
            )
            .await
            .unwrap()
            .map(|row| row.get(0));
        got["status_after"] = json!(status);
        if got != case["expect"] {
            failures.push(format!(
                "{}:\n  rust door {got}\n  vectors   {}",
                case["name"], case["expect"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
