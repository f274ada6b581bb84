//! One delivery through the Rust door, from the command line (the cross-language tests
//! run it beside the Python package and the Ruby gem on one record):
//!
//!     DATABASE_URL=… cargo run -p idempotent_job_rust --example perform_once -- JOB KEY [SECONDS] [PAYLOAD]
//!
//! Runs a body that takes SECONDS (default 0) and returns `"rust ran KEY"`, with
//! `store_result` on and PAYLOAD (JSON, default `[]`) as the payload, and prints the outcome as one JSON line:
//! `{"decision": "ran", "value": "rust ran 42", "replayed": false, "retry_after": null}`.

use idempotent_job_rust::{Config, IdempotentJob};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (job_type, key) = (args.next().ok_or("JOB")?, args.next().ok_or("KEY")?);
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0.0);
    let payload: serde_json::Value = serde_json::from_str(&args.next().unwrap_or("[]".into()))?;
    let jobs = IdempotentJob::configure(Config::new(std::env::var("DATABASE_URL")?))?;
    let job = jobs.job(job_type).store_result(true).build()?;
    // An all-digit key is an integer key, as the Ruby and Python tests pass it.
    let key: serde_json::Value = match key.parse::<i64>() {
        Ok(n) => n.into(),
        Err(_) => key.into(),
    };
    let outcome = job
        .delivery(key)
        .payload(payload)
        .run(|claim| async move {
            tokio::time::sleep(std::time::Duration::from_secs_f64(seconds)).await;
            Ok::<_, std::io::Error>(format!("rust ran {}", claim.operation_key))
        })
        .await?;
    jobs.settle().await?;
    println!(
        "{}",
        serde_json::json!({
            "decision": outcome.decision.as_str(),
            "value": outcome.value,
            "replayed": outcome.replayed,
            "retry_after": outcome.retry_after,
        })
    );
    Ok(())
}
