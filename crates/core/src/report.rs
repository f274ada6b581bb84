//! Read-only lists for operators (the web page, `IdempotentJob::Web`): given-up
//! operations, records of one job type, recent takeovers, stale claims and the job
//! types present. Each list returns keys; the caller reads each record with
//! [`crate::record::FIND_SQL`], so the record has one definition. Nothing here writes.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::error::{Error, Result};
use crate::sql::{
    GIVEN_UP_SQL, JOB_TYPES_SQL, METRICS_SQL, SEARCH_SQL, STALE_CLAIMS_SQL, TAKEOVERS_SQL,
};

/// The statuses a record can have (the table's check constraint).
pub const STATUSES: [&str; 5] = ["claimed", "completed", "released", "held", "given_up"];

/// `(job_type, operation_key)` pairs.
pub type Keys = Vec<(String, String)>;

fn check_limit(limit: i64) -> Result<()> {
    if limit < 1 {
        return Err(Error::Config(format!(
            "a list needs a limit of at least 1, got {limit}"
        )));
    }
    Ok(())
}

async fn keys(client: &Client, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<Keys> {
    let rows = client.query_typed(sql, params).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// Keys of given-up operations (see [`GIVEN_UP_SQL`]).
///
/// Errors: [`Error::Config`] for a limit below 1; connection/database errors.
pub async fn given_up(client: &Client, job_type: Option<&str>, limit: i64) -> Result<Keys> {
    check_limit(limit)?;
    keys(
        client,
        GIVEN_UP_SQL,
        &[(&job_type, Type::TEXT), (&limit, Type::INT8)],
    )
    .await
}

/// Keys of records of `job_type`, optionally those whose operation key starts with
/// `key_prefix` and that have `status` (see [`SEARCH_SQL`]).
///
/// Errors: [`Error::Config`] for an empty job type, an unknown status or a limit
/// below 1; connection/database errors.
pub async fn search(
    client: &Client,
    job_type: &str,
    key_prefix: Option<&str>,
    status: Option<&str>,
    limit: i64,
) -> Result<Keys> {
    check_limit(limit)?;
    if job_type.is_empty() {
        return Err(Error::Config("a record search needs a job type".into()));
    }
    if let Some(s) = status.filter(|s| !STATUSES.contains(s)) {
        return Err(Error::Config(format!(
            "unknown record status {s:?} (known: {})",
            STATUSES.join(", ")
        )));
    }
    keys(
        client,
        SEARCH_SQL,
        &[
            (&job_type, Type::TEXT),
            (&key_prefix, Type::TEXT),
            (&status, Type::TEXT),
            (&limit, Type::INT8),
        ],
    )
    .await
}

/// Keys of records taken over since `since` (see [`TAKEOVERS_SQL`]).
///
/// Errors: [`Error::Config`] for a limit below 1; connection/database errors.
pub async fn takeovers(client: &Client, since: DateTime<Utc>, limit: i64) -> Result<Keys> {
    check_limit(limit)?;
    keys(
        client,
        TAKEOVERS_SQL,
        &[(&since, Type::TIMESTAMPTZ), (&limit, Type::INT8)],
    )
    .await
}

/// Keys of stale claims not yet taken over (see [`STALE_CLAIMS_SQL`]).
///
/// Errors: [`Error::Config`] for a limit below 1; connection/database errors.
pub async fn stale_claims(client: &Client, limit: i64) -> Result<Keys> {
    check_limit(limit)?;
    keys(client, STALE_CLAIMS_SQL, &[(&limit, Type::INT8)]).await
}

/// The job types present, in order, at most `limit` (see [`JOB_TYPES_SQL`]).
///
/// Errors: [`Error::Config`] for a limit below 1; connection/database errors.
pub async fn job_types(client: &Client, limit: i64) -> Result<Vec<String>> {
    check_limit(limit)?;
    let rows = client
        .query_typed(JOB_TYPES_SQL, &[(&limit, Type::INT8)])
        .await?;
    rows.iter().map(|row| Ok(row.try_get(0)?)).collect()
}

/// One job type's row of [`METRICS_SQL`]: counts of records, and the oldest held
/// operation's age in seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobTypeMetrics {
    /// The job type the row counts.
    pub job_type: String,
    /// Records by status, in [`STATUSES`] order.
    pub records: [i64; 5],
    /// Claims whose lease has not run out.
    pub live_claims: i64,
    /// Claims whose lease ran out (stale claims) and that nobody took over yet.
    pub stale_claims: i64,
    /// Seconds since the oldest held operation was held; 0 when none is.
    pub oldest_held_seconds: f64,
    /// Held operations the reclaim budget (`max_takeovers`) held: bodies that kept
    /// killing their worker.
    pub held_by_reclaim_budget: i64,
    /// Repeated deliveries recorded in the last hour (at most the kept repeat times
    /// per operation).
    pub repeats_last_hour: i64,
    /// Operations with a repeat in the last hour.
    pub repeated_operations_last_hour: i64,
    /// Finished records (completed or given up) older than the retention: what a
    /// purge would delete now.
    pub purge_backlog: i64,
}

/// The metrics of every job type (see [`METRICS_SQL`]), by job type.
///
/// Errors: [`Error::Config`] for a negative or non-finite retention;
/// connection/database errors.
pub async fn metrics(client: &Client, retention_seconds: f64) -> Result<Vec<JobTypeMetrics>> {
    if !(retention_seconds >= 0.0 && retention_seconds.is_finite()) {
        return Err(Error::Config(format!(
            "metrics need a retention of at least 0 seconds, got {retention_seconds}"
        )));
    }
    let rows = client
        .query_typed(METRICS_SQL, &[(&retention_seconds, Type::FLOAT8)])
        .await?;
    rows.iter()
        .map(|row| {
            Ok(JobTypeMetrics {
                job_type: row.try_get("job_type")?,
                records: [
                    row.try_get("claimed")?,
                    row.try_get("completed")?,
                    row.try_get("released")?,
                    row.try_get("held")?,
                    row.try_get("given_up")?,
                ],
                live_claims: row.try_get("live_claims")?,
                stale_claims: row.try_get("stale_claims")?,
                oldest_held_seconds: row.try_get("oldest_held_seconds")?,
                held_by_reclaim_budget: row.try_get("held_by_reclaim_budget")?,
                repeats_last_hour: row.try_get("repeats_last_hour")?,
                repeated_operations_last_hour: row.try_get("repeated_operations_last_hour")?,
                purge_backlog: row.try_get("purge_backlog")?,
            })
        })
        .collect()
}

/// The metric families of [`exposition`]: name, help text. Every one is a gauge.
pub const METRIC_FAMILIES: [(&str, &str); 8] = [
    (
        "idempotent_job_records",
        "Idempotency records by job type and status.",
    ),
    (
        "idempotent_job_claims",
        "Claimed records by job type: state live (lease running) or stale (lease expired, not yet taken over).",
    ),
    (
        "idempotent_job_oldest_held_age_seconds",
        "Seconds since the oldest held operation of the job type was held (0 when none is held).",
    ),
    (
        "idempotent_job_held_by_reclaim_budget",
        "Held operations of the job type that the reclaim budget (max_takeovers) held: bodies that kept killing their worker.",
    ),
    (
        "idempotent_job_repeats_last_hour",
        "Repeated deliveries recorded in the last hour (at most 20 per operation).",
    ),
    (
        "idempotent_job_repeated_operations_last_hour",
        "Operations with a repeated delivery recorded in the last hour.",
    ),
    (
        "idempotent_job_purge_backlog",
        "Finished records (completed or given up) older than the retention: what a purge would delete now.",
    ),
    (
        "idempotent_job_retention_seconds",
        "The retention the purge backlog is counted at, in seconds.",
    ),
];

/// A label value escaped for the text exposition format (backslash, double quote,
/// line feed).
fn label(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

/// A sample's value as the text exposition format writes it: `+Inf`, `-Inf` and `NaN`
/// by its words (Rust writes `inf`), any other number as Rust writes it.
fn gauge(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        value.to_string()
    }
}

/// `rows` (from [`metrics`]) in Prometheus' text exposition format (version 0.0.4):
/// each family of [`METRIC_FAMILIES`] with its `# HELP` and `# TYPE gauge` lines and
/// one sample per job type (and status, or claim state). A table with no records
/// gives the families without samples, and the retention.
pub fn exposition(rows: &[JobTypeMetrics], retention_seconds: f64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (name, help) in METRIC_FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        if name == "idempotent_job_retention_seconds" {
            let _ = writeln!(out, "{name} {}", gauge(retention_seconds));
            continue;
        }
        for row in rows {
            let job_type = label(&row.job_type);
            let mut sample = |labels: String, value: String| {
                let _ = writeln!(out, "{name}{{job_type=\"{job_type}\"{labels}}} {value}");
            };
            match name {
                "idempotent_job_records" => {
                    for (status, count) in STATUSES.iter().zip(row.records) {
                        sample(format!(",status=\"{status}\""), count.to_string());
                    }
                }
                "idempotent_job_claims" => {
                    sample(",state=\"live\"".into(), row.live_claims.to_string());
                    sample(",state=\"stale\"".into(), row.stale_claims.to_string());
                }
                "idempotent_job_oldest_held_age_seconds" => {
                    sample(String::new(), gauge(row.oldest_held_seconds))
                }
                "idempotent_job_held_by_reclaim_budget" => {
                    sample(String::new(), row.held_by_reclaim_budget.to_string())
                }
                "idempotent_job_repeats_last_hour" => {
                    sample(String::new(), row.repeats_last_hour.to_string())
                }
                "idempotent_job_repeated_operations_last_hour" => {
                    sample(String::new(), row.repeated_operations_last_hour.to_string())
                }
                "idempotent_job_purge_backlog" => {
                    sample(String::new(), row.purge_backlog.to_string())
                }
                _ => unreachable!("every family of METRIC_FAMILIES has its samples"),
            }
        }
    }
    out
}
