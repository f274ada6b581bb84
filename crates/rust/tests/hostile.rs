//! The shared table of hostile values (conformance/hostile.json, issue 29) through the
//! Rust door against real PostgreSQL: each value a `serde_json::Value` can hold as an
//! operation key, a payload and a result. The test process survives (a stack overflow
//! would abort it), the body runs at most once, a refusal is the door's error naming the
//! job and the problem. Values no `Value` can hold (NaN, infinities, bytes that are not
//! UTF-8, decimals, objects) never reach the door: serde_json refuses them first.

use idempotent_job_rust::{Config, IdempotentJob, PerformError};
use serde_json::Value;

fn url() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL (bin/services start)")
}

fn table() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conformance/hostile.json"
    );
    let table: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    table["cases"].as_array().unwrap().clone()
}

/// The case's value, or None when a `serde_json::Value` cannot hold it.
fn value(case: &Value) -> Option<Value> {
    if let Some(json) = case["json"].as_str() {
        return Some(serde_json::from_str(json).unwrap());
    }
    let make = case["make"].as_object().unwrap();
    let (name, argument) = make.iter().next().unwrap();
    match name.as_str() {
        "nest" => {
            let mut value = Value::from(1);
            for _ in 0..argument.as_u64().unwrap() {
                value = Value::Array(vec![value]);
            }
            Some(value)
        }
        "string_bytes" => Some(Value::String(
            "x".repeat(argument.as_u64().unwrap() as usize),
        )),
        "integer_digits" => {
            let digits = "9".repeat(argument.as_u64().unwrap() as usize);
            Some(Value::Number(serde_json::Number::from_string_unchecked(
                digits,
            )))
        }
        _ => None, // NaN, infinities, bytes, decimals, objects: no Value holds them
    }
}

/// Forgets a value too deep for serde_json's recursive drop (the test's own copy).
fn discard(value: Value) {
    if idempotent_job_core::canonical::nested_too_deep(&value) {
        std::mem::forget(value);
    }
}

fn check_refusal(case: &Value, job_type: &str, message: &str) {
    assert!(message.starts_with(job_type), "{message}");
    let problem = case["problem"].as_str().unwrap().to_lowercase();
    assert!(message.to_lowercase().contains(&problem), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_as_key_payload_and_result() {
    let jobs = IdempotentJob::configure(Config::new(url())).unwrap();
    jobs.migrate().await.unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut covered = 0;
    for (i, case) in table().iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        let Some(probe) = value(case) else { continue };
        discard(probe);
        covered += 1;

        // As an operation key.
        let job_type = format!("RustHostileKey{i}-{}", &run[..8]);
        let job = jobs.job(&job_type).build().unwrap();
        let mut runs = 0;
        for _ in 0..2 {
            let outcome = job
                .perform_once(value(case).unwrap(), |_| {
                    runs += 1;
                    async { Ok::<_, std::io::Error>(()) }
                })
                .await;
            match (case["key"].as_str().unwrap(), outcome) {
                ("refused", Err(PerformError::Core(e))) => {
                    assert_eq!(e.class_name(), "OperationKeyError", "{name}");
                    check_refusal(case, &job_type, &e.to_string());
                }
                ("runs", Ok(_)) => {}
                (expected, other) => panic!(
                    "{name} as a key: expected {expected}, got {:?}",
                    other.map(|o| o.decision)
                ),
            }
        }
        assert_eq!(runs, usize::from(case["key"] == "runs"), "{name} as a key");

        // As a payload.
        let job_type = format!("RustHostilePayload{i}-{}", &run[..8]);
        let job = jobs.job(&job_type).build().unwrap();
        let mut runs = 0;
        for _ in 0..2 {
            let outcome = job
                .delivery("p")
                .payload(Value::Array(vec![value(case).unwrap()]))
                .run(|_| {
                    runs += 1;
                    async { Ok::<_, std::io::Error>(()) }
                })
                .await;
            match (case["payload"].as_str().unwrap(), outcome) {
                ("refused", Err(PerformError::Core(e))) => {
                    assert_eq!(e.class_name(), "ConfigurationError", "{name}");
                    check_refusal(case, &job_type, &e.to_string());
                }
                ("runs", Ok(_)) => {}
                (expected, other) => panic!(
                    "{name} as a payload: expected {expected}, got {:?}",
                    other.map(|o| o.decision)
                ),
            }
        }
        assert_eq!(
            runs,
            usize::from(case["payload"] == "runs"),
            "{name} as a payload"
        );

        // As a result: serde serializes the body's value recursively (as its drop and
        // clone do), so a result is only as deep as the caller's own stack allows; the
        // door judges what it gets without recursion.
        let hostile = value(case).unwrap();
        if case["make"]["nest"].as_u64().is_some_and(|n| n > 1000) {
            discard(hostile);
            continue;
        }
        let job_type = format!("RustHostileResult{i}-{}", &run[..8]);
        let job = jobs.job(&job_type).store_result(true).build().unwrap();
        let mut runs = 0;
        let mut replays = vec![];
        for _ in 0..2 {
            let outcome = job
                .perform_once("r", |_| {
                    runs += 1;
                    let value = hostile.clone();
                    async move { Ok::<_, std::io::Error>(value) }
                })
                .await
                .unwrap();
            replays.push((outcome.decision.as_str(), outcome.replayed));
        }
        let stored = case["result"] == "stored";
        assert_eq!(runs, 1, "{name} as a result");
        assert_eq!(
            replays,
            [("ran", false), ("completed", stored)],
            "{name} as a result"
        );
        discard(hostile);
    }
    assert!(
        covered >= 12,
        "the table's Value-holdable cases ran ({covered})"
    );
}

/// A value nested a million deep, built without recursion.
fn deep(levels: usize) -> Value {
    let mut value = Value::from(1);
    for _ in 0..levels {
        value = Value::Array(vec![value]);
    }
    value
}

/// Facts and composite key parts nested past the core's limit (a million deep, as a
/// Rust caller can build them): refused naming the job, the process survives (the
/// door's writing or dropping them recursively would overflow the stack), the body
/// never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facts_and_composite_parts_nested_a_million_deep_are_refused_without_a_crash() {
    let jobs = IdempotentJob::configure(Config::new(url())).unwrap();
    jobs.migrate().await.unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let job_type = format!("RustDeepFacts-{}", &run[..8]);
    let job = jobs.job(&job_type).build().unwrap();
    let mut runs = 0;
    // (Not json!: it serializes the value it is given, recursively.)
    let mut facts = serde_json::Map::new();
    facts.insert("trace".into(), deep(1_000_000));
    let facts = Value::Object(facts);
    let refused = job
        .delivery("k")
        .facts(facts)
        .run(|_| {
            runs += 1;
            async { Ok::<_, std::io::Error>(()) }
        })
        .await;
    let Err(PerformError::Core(error)) = refused else {
        panic!("deep facts were not refused");
    };
    assert!(error.to_string().contains(&job_type), "{error}");
    assert_eq!(runs, 0);

    let job_type = format!("RustDeepParts-{}", &run[..8]);
    let refused =
        idempotent_job_rust::composite_key(&job_type, vec![Value::from(1), deep(1_000_000)]);
    let Err(error) = refused else {
        panic!("a deep composite part was not refused");
    };
    assert!(error.to_string().contains(&job_type), "{error}");
}
