//! The Rust door against its floor (issue 33's targets), run by `bin/bench --only rust`
//! or on its own:
//!
//!     DATABASE_URL=… cargo run --release -p idempotent_job_rust --example bench_door -- [OPERATIONS] [ROUNDS]
//!
//! One task delivers OPERATIONS first deliveries (a new key each, the body returns at
//! once) and then OPERATIONS duplicates (the completed keys again), through the door
//! (`Job::perform_once`) and through the floor: the core's own statements (`DELIVER_SQL`,
//! then `COMPLETE_SQL`; a duplicate only `DELIVER_SQL`) sent raw with tokio-postgres on one
//! connection, prepared, with the same parameters. The variants alternate in batches of
//! 20 deliveries (statements prepared once per batch on both sides); the ratio of each round is door / floor time per operation, the median printed. Prints
//! one JSON line last: `{"first": {...}, "duplicate": {...}}`.

use std::time::Instant;

use idempotent_job_core::sql::{COMPLETE_SQL, DELIVER_SQL};
use idempotent_job_rust::{Config, IdempotentJob, Job};

const JOB: &str = "RustBench";
/// Deliveries per interleaved batch.
const BATCH: usize = 20;

async fn door(job: &Job, keys: &[String]) -> f64 {
    let started = Instant::now();
    for key in keys {
        let outcome = job
            .perform_once(key.clone(), |_| async { Ok::<_, std::io::Error>(()) })
            .await
            .expect("door");
        std::hint::black_box(outcome);
    }
    started.elapsed().as_secs_f64() / keys.len() as f64
}

async fn floor(db: &tokio_postgres::Client, keys: &[String], complete: bool) -> f64 {
    use tokio_postgres::types::Type;
    // The core's parameter types (claim.rs, fenced.rs): text, uuid, float8.
    let (t, u, f) = (Type::TEXT, Type::UUID, Type::FLOAT8);
    let deliver = db
        .prepare_typed(
            DELIVER_SQL,
            &[
                t.clone(),
                t.clone(),
                u.clone(),
                t.clone(),
                f,
                t.clone(),
                t.clone(),
                t.clone(),
            ],
        )
        .await
        .unwrap();
    let completion = db
        .prepare_typed(COMPLETE_SQL, &[t.clone(), t.clone(), u, t.clone(), t])
        .await
        .unwrap();
    let started = Instant::now();
    for key in keys {
        let token = uuid::Uuid::new_v4();
        let jid = token.to_string();
        let digest = idempotent_job_core::canonical::digest(&serde_json::json!([]));
        let row = db
            .query_one(
                &deliver,
                &[
                    &JOB,
                    key,
                    &token,
                    &jid,
                    &300.0f64,
                    &digest,
                    &JOB,
                    &None::<String>,
                ],
            )
            .await
            .unwrap();
        if complete && row.get::<_, bool>("inserted") {
            db.query(
                &completion,
                &[&JOB, key, &token, &None::<String>, &None::<String>],
            )
            .await
            .unwrap();
        }
    }
    started.elapsed().as_secs_f64() / keys.len() as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let operations: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3);
    let url = std::env::var("DATABASE_URL")?;
    let jobs = IdempotentJob::configure(Config::new(url.clone()))?;
    jobs.migrate().await?;
    let job = jobs.job(JOB).build()?;
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let keys = |variant: &str, round: usize| -> Vec<String> {
        (0..operations)
            .map(|n| format!("{run}-{variant}-{round}-{n}"))
            .collect()
    };
    // Warm both paths (connections, prepared statements, the pool).
    door(&job, &keys("warm-door", 0)[..50.min(operations)]).await;
    floor(&db, &keys("warm-floor", 0)[..50.min(operations)], true).await;
    let (mut first, mut duplicate) = (vec![], vec![]);
    let (mut door_times, mut floor_times) = ((vec![], vec![]), (vec![], vec![]));
    for round in 0..rounds {
        let (door_keys, floor_keys) = (keys("door", round), keys("floor", round));
        // Batches of BATCH deliveries, the two variants interleaved (which goes first
        // alternates), so a change of the machine's load falls on both.
        let (mut d1, mut f1, mut d2, mut f2) = (0.0, 0.0, 0.0, 0.0);
        for duplicates in [false, true] {
            for (n, start) in (0..operations).step_by(BATCH).enumerate() {
                let end = (start + BATCH).min(operations);
                let share = (end - start) as f64 / operations as f64;
                for door_turn in if (n + round) % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                } {
                    if door_turn {
                        let t = door(&job, &door_keys[start..end]).await * share;
                        if duplicates {
                            d2 += t
                        } else {
                            d1 += t
                        }
                    } else {
                        let t = floor(&db, &floor_keys[start..end], !duplicates).await * share;
                        if duplicates {
                            f2 += t
                        } else {
                            f1 += t
                        }
                    }
                }
            }
        }
        first.push(d1 / f1);
        duplicate.push(d2 / f2);
        door_times.0.push(d1);
        door_times.1.push(d2);
        floor_times.0.push(f1);
        floor_times.1.push(f2);
        println!(
            "round {round}: first delivery door {:.0} µs, floor {:.0} µs ({:.2}x); duplicate door {:.0} µs, floor {:.0} µs ({:.2}x)",
            d1 * 1e6, f1 * 1e6, d1 / f1, d2 * 1e6, f2 * 1e6, d2 / f2
        );
    }
    jobs.settle().await?;
    let figures = serde_json::json!({
        "operations": operations,
        "rounds": rounds,
        "first": {"door_us": median(door_times.0) * 1e6, "floor_us": median(floor_times.0) * 1e6,
                  "ratio": median(first), "target": 1.10},
        "duplicate": {"door_us": median(door_times.1) * 1e6, "floor_us": median(floor_times.1) * 1e6,
                      "ratio": median(duplicate), "target": 1.20},
    });
    println!("{figures}");
    Ok(())
}
