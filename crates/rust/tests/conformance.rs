//! The conformance vectors (conformance/vectors.json, docs/conformance.md) through the Rust
//! door's public API: canonical JSON as keys, operation keys and refusals, composite keys,
//! the unreachable delay, and every decision case delivered by `Delivery::run` /
//! `run_looking_up` on the suite's PostgreSQL (DATABASE_URL). The core's, the Ruby and the
//! Python suites read the same file: a door that drifts fails, naming the case.

use idempotent_job_rust::{
    composite_key, operation_key, unreachable_delay, Config, Error, IdempotentJob, LookupAnswer,
    OnMismatch, OnStale, PerformError,
};
use serde_json::{json, Value};

const JOB: &str = "ConformanceJob";

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conformance/vectors.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cases<'a>(v: &'a Value, section: &str) -> &'a Vec<Value> {
    v[section]["cases"].as_array().unwrap()
}

fn check_key(case: &Value, got: Result<String, Error>) {
    let name = case["name"].as_str().unwrap();
    match (case.get("text"), got) {
        (Some(text), Ok(got)) => assert_eq!(got, text.as_str().unwrap(), "{name}"),
        (None, Err(Error::OperationKey(message))) => {
            let refused = case["refused"].as_str().unwrap();
            assert!(
                message.contains(refused),
                "{name}: {message:?} lacks {refused:?}"
            );
        }
        (_, got) => panic!("{name}: got {got:?}"),
    }
}

#[test]
fn keys_composite_keys_canonical_json_and_delays() {
    let v = vectors();
    assert_eq!(v["format"], 1);
    for case in cases(&v, "keys") {
        let value: Value = serde_json::from_str(case["json"].as_str().unwrap()).unwrap();
        check_key(
            case,
            operation_key(case["job_type"].as_str().unwrap_or("Job"), value),
        );
    }
    for case in cases(&v, "composite_keys") {
        let parts: Vec<Value> = serde_json::from_str(case["parts_json"].as_str().unwrap()).unwrap();
        check_key(case, composite_key("Job", parts));
    }
    for case in cases(&v, "canonical") {
        let value: Value = serde_json::from_str(case["json"].as_str().unwrap()).unwrap();
        let non_empty = value.as_array().is_some_and(|a| !a.is_empty())
            || value.as_object().is_some_and(|o| !o.is_empty());
        if non_empty {
            assert_eq!(
                operation_key("Job", value).unwrap(),
                case["canonical"].as_str().unwrap()
            );
        }
    }
    for case in v["delays"]["unreachable"].as_array().unwrap() {
        let failures = case["failures"].as_u64().unwrap() as u32;
        assert_eq!(unreachable_delay(failures), case["delay"].as_f64().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions() {
    let v = vectors();
    let section = &v["decisions"];
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (bin/services start)");
    let jobs = IdempotentJob::configure(Config::new(url.clone())).unwrap();
    jobs.migrate().await.unwrap();
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let plain = jobs.job(JOB).heartbeat(false).build().unwrap();
    let mut failures = vec![];
    for case in cases(&v, "decisions") {
        let name = case["name"].as_str().unwrap();
        let key = format!("conformance-{}", uuid::Uuid::new_v4());
        let record = case["record"].as_str().unwrap();
        if record != "absent" {
            let first = plain
                .delivery(key.clone())
                .payload(section["payload_a"].clone())
                .run(|_| async { Ok::<_, std::io::Error>(()) })
                .await
                .unwrap();
            assert!(first.ran(), "{name}: set-up");
            let setup = &section["setup"][record];
            let status = setup["status"].as_str().unwrap();
            let expires = setup["lease_expires_in"].as_f64().unwrap();
            let sql = section["setup_sql"].as_str().unwrap();
            let sql = sql.replace("$4::float8", "$4");
            let changed = db
                .execute(&sql, &[&JOB, &key, &status, &expires])
                .await
                .unwrap();
            assert_eq!(changed, 1, "{name}: set-up");
        }
        let options = &case["options"];
        let mut job = jobs
            .job(JOB)
            .heartbeat(false)
            .on_stale(match options["on_stale"].as_str().unwrap() {
                "hold" => OnStale::Hold,
                "skip" => OnStale::Skip,
                _ => OnStale::Reclaim,
            })
            .on_mismatch(match options["on_mismatch"].as_str().unwrap() {
                "raise" => OnMismatch::Raise,
                _ => OnMismatch::Log,
            });
        let answer = options["lookup"].as_str().map(|a| match a {
            "done" => LookupAnswer::Done,
            "not_done" => LookupAnswer::NotDone,
            _ => LookupAnswer::Unknown,
        });
        if answer.is_some() {
            job = job.lookup("lookup");
        }
        let job = job.build().unwrap();
        let payload = if case["payload"] == "same" {
            &section["payload_a"]
        } else {
            &section["payload_b"]
        };
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let deferrals = case["deferrals"].as_u64().map_or(0, |n| n as u32);
        let delivery = job
            .delivery(key.clone())
            .payload(payload.clone())
            .deferrals(deferrals);
        let body = {
            let ran = ran.clone();
            move |_| async move {
                ran.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<(), std::io::Error>(())
            }
        };
        let result = match answer {
            Some(answer) => {
                let asked = asked.clone();
                delivery
                    .run_looking_up(
                        move |_| async move {
                            asked.store(true, std::sync::atomic::Ordering::SeqCst);
                            answer
                        },
                        body,
                    )
                    .await
            }
            None => delivery.run(body).await,
        };
        let mut got = match result {
            Ok(outcome) => json!({
                "decision": outcome.decision.as_str(),
                "error": null,
                "claim": outcome.claim.map(|c| c.kind.as_str()),
                "duplicates": outcome.duplicates,
                "retry_after": outcome.retry_after,
            }),
            Err(PerformError::Core(Error::PayloadMismatch { .. })) => json!({
                "decision": null, "error": "payload_mismatch", "claim": null,
                "duplicates": null, "retry_after": null,
            }),
            Err(e) => panic!("{name}: {e}"),
        };
        got["ran"] = ran.load(std::sync::atomic::Ordering::SeqCst).into();
        got["lookup_asked"] = asked.load(std::sync::atomic::Ordering::SeqCst).into();
        let status: Option<String> = db
            .query_opt(
                "SELECT status FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2",
                &[&JOB, &key],
            )
            .await
            .unwrap()
            .map(|row| row.get(0));
        got["status_after"] = status.into();
        if got != case["expect"] {
            failures.push(format!("{name}: got {got}, expected {}", case["expect"]));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) drift:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
