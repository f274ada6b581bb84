//! An SQS consumer with the idempotent_job Rust door (docs/rust.md): each message's body
//! `{"order_id": "…", "cents": N}` charges the order at most once per `order_id`, however
//! often SQS delivers it, across any number of consumers (and Python or Ruby doors with
//! the job type `ChargeOrder`).
//!
//! While a body runs, its message's visibility is extended to one lease on the lease's
//! renewal beat (a third of the lease, when the core renews the claim), so no copy is
//! delivered while the first run lives; a killed consumer's message comes back within one
//! lease and the stale policy decides. SIGTERM / Ctrl-C: the running body finishes, polling
//! stops.
//!
//! Environment: `QUEUE_URL`, `DATABASE_URL`; `SQS_ENDPOINT` (e.g. moto_server's
//! `http://127.0.0.1:PORT`, an emulator; default AWS), `AWS_REGION` (us-east-1),
//! `LEASE` (seconds, 60), `ON_STALE` (reclaim, hold, skip), `CHARGE_SECONDS` (how long
//! a charge takes, 0). Credentials: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`.
//!
//! Prints one line per message: `<message id> <order id> <action>`.

use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;
use aws_sdk_sqs::Client;
use idempotent_job_rust::{
    unreachable_delay, Config, Decision, IdempotentJob, Job, OnStale, PerformError,
};
use tokio::signal::unix::{signal, SignalKind};

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let queue = std::env::var("QUEUE_URL")?;
    let database_url = std::env::var("DATABASE_URL")?;
    let jobs = IdempotentJob::configure(Config::new(database_url.clone()))?;
    jobs.migrate().await?;
    let on_stale = match env("ON_STALE", "reclaim").as_str() {
        "hold" => OnStale::Hold,
        "skip" => OnStale::Skip,
        _ => OnStale::Reclaim,
    };
    let job = jobs
        .job("ChargeOrder")
        .lease(env("LEASE", "60").parse()?)
        .on_stale(on_stale)
        .id_label("message")
        .build()?;
    let sqs = client().await;
    let (db, connection) = tokio_postgres::connect(&database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    // Consumers start together: one advisory lock around the create, or two sessions can
    // both pass IF NOT EXISTS and one fail on pg_type's unique index.
    db.batch_execute(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('example_charges')); \
         CREATE TABLE IF NOT EXISTS example_charges (order_id text, cents int, pid int, at timestamptz DEFAULT now()); \
         COMMIT",
    )
    .await?;
    let db = std::sync::Arc::new(db);
    let charge_seconds: f64 = env("CHARGE_SECONDS", "0").parse()?;

    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    eprintln!("consuming {queue} (pid {})", std::process::id());
    loop {
        let receive = sqs
            .receive_message()
            .queue_url(&queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send();
        let answer = tokio::select! {
            _ = term.recv() => break,
            _ = interrupt.recv() => break,
            answer = receive => answer?,
        };
        for message in answer.messages() {
            let action = deliver(&sqs, &queue, &job, message, &db, charge_seconds).await?;
            println!(
                "{} {} {action}",
                message.message_id().unwrap_or("-"),
                order_id(message).unwrap_or_default()
            );
        }
    }
    jobs.settle().await?;
    eprintln!("stopped");
    Ok(())
}

/// The SQS client: the default AWS endpoint, or `SQS_ENDPOINT` (an emulator).
async fn client() -> Client {
    let mut config = aws_sdk_sqs::Config::builder()
        .region(aws_sdk_sqs::config::Region::new(env(
            "AWS_REGION",
            "us-east-1",
        )))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            env("AWS_ACCESS_KEY_ID", "test"),
            env("AWS_SECRET_ACCESS_KEY", "test"),
            None,
            None,
            "environment",
        ));
    if let Ok(endpoint) = std::env::var("SQS_ENDPOINT") {
        config = config.endpoint_url(endpoint);
    }
    Client::from_conf(config.build())
}

fn order_id(message: &aws_sdk_sqs::types::Message) -> Option<String> {
    let body: serde_json::Value = serde_json::from_str(message.body()?).ok()?;
    body.get("order_id")?.as_str().map(str::to_string)
}

/// One message through the door; returns what became of it: `delete` (ran, or a repeat
/// of a finished operation), `defer` (in progress elsewhere, or PostgreSQL unreachable:
/// visible again later), `leave` (the body failed: back after its visibility timeout, or
/// to the dead-letter queue).
async fn deliver(
    sqs: &Client,
    queue: &str,
    job: &Job,
    message: &aws_sdk_sqs::types::Message,
    db: &std::sync::Arc<tokio_postgres::Client>,
    charge_seconds: f64,
) -> Result<&'static str, aws_sdk_sqs::Error> {
    let receipt = message.receipt_handle().unwrap_or_default().to_string();
    let receives: u32 = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let Some(order) = order_id(message) else {
        eprintln!(
            "message {:?} has no order_id: left for the redrive policy",
            message.message_id()
        );
        return Ok("leave");
    };
    let body: serde_json::Value =
        serde_json::from_str(message.body().unwrap_or("null")).unwrap_or_default();
    let cents = body.get("cents").and_then(|c| c.as_i64()).unwrap_or(0) as i32;
    let outcome = job
        .delivery(order.clone())
        .id(message.message_id().unwrap_or_default())
        .payload(body)
        .deferrals(receives.saturating_sub(1))
        .run(|claim| {
            // The visibility follows the lease: extended on the renewal beat while the body runs.
            let keeper = tokio::spawn(keep_hidden(
                sqs.clone(),
                queue.to_string(),
                receipt.clone(),
                job.renewal_interval(),
                job.lease().ceil() as i32,
            ));
            let db = db.clone();
            async move {
                tokio::time::sleep(Duration::from_secs_f64(charge_seconds)).await;
                let charged = db
                    .execute(
                        "INSERT INTO example_charges (order_id, cents, pid) VALUES ($1, $2, $3)",
                        &[&claim.operation_key, &cents, &(std::process::id() as i32)],
                    )
                    .await;
                keeper.abort();
                charged
            }
        })
        .await;
    let visible_in = |seconds: f64| {
        sqs.change_message_visibility()
            .queue_url(queue)
            .receipt_handle(&receipt)
            .visibility_timeout(seconds.ceil().clamp(0.0, 43_200.0) as i32)
            .send()
    };
    Ok(match outcome {
        Ok(outcome) if outcome.decision == Decision::InProgress => {
            visible_in(outcome.retry_after.unwrap_or(1.0)).await?;
            "defer"
        }
        Ok(_) => {
            sqs.delete_message()
                .queue_url(queue)
                .receipt_handle(&receipt)
                .send()
                .await?;
            "delete"
        }
        Err(PerformError::Core(error)) if error.retryable() => {
            // The claim could not be made: the body did not run; never lose the message.
            visible_in(unreachable_delay(receives.saturating_sub(1))).await?;
            "defer"
        }
        Err(error) => {
            eprintln!("order {order}: {error}; the message is left for redelivery");
            "leave"
        }
    })
}

/// Every `every`, sets the message's visibility to `seconds` from now (until aborted).
async fn keep_hidden(sqs: Client, queue: String, receipt: String, every: Duration, seconds: i32) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(error) = sqs
            .change_message_visibility()
            .queue_url(&queue)
            .receipt_handle(&receipt)
            .visibility_timeout(seconds)
            .send()
            .await
        {
            eprintln!("could not extend a message's visibility: {error}");
        }
    }
}
