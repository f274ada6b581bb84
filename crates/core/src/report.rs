//! Read-only lists for operators (the web page, `IdempotentJob::Web`): given-up
//! operations, records of one job type, recent takeovers, stale claims and the job
//! types present. Each list returns keys; the caller reads each record with
//! [`crate::record::FIND_SQL`], so the record has one definition. Nothing here writes.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::error::{Error, Result};

/// The statuses a record can have (the table's check constraint).
pub const STATUSES: [&str; 5] = ["claimed", "completed", "released", "held", "given_up"];

/// Operations given up by the `:skip` policy, most recent first.
/// Parameters: $1 job_type or NULL for all, $2 limit.
pub const GIVEN_UP_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE status = 'given_up' AND ($1::text IS NULL OR job_type = $1)
 ORDER BY given_up_at DESC, job_type, operation_key
 LIMIT $2"#;

/// Records of one job type, most recently changed first (the primary key's leading
/// column narrows the scan). Parameters: $1 job_type, $2 operation-key prefix or NULL,
/// $3 status or NULL, $4 limit.
pub const SEARCH_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE job_type = $1
   AND ($2::text IS NULL OR starts_with(operation_key, $2))
   AND ($3::text IS NULL OR status = $3)
 ORDER BY updated_at DESC, operation_key
 LIMIT $4"#;

/// Records whose latest claim took over an expired lease at or after $1, newest first:
/// each is a claim its previous holder lost. Parameters: $1 since, $2 limit.
pub const TAKEOVERS_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE last_claim = 'takeover' AND claimed_at >= $1
 ORDER BY claimed_at DESC, job_type, operation_key
 LIMIT $2"#;

/// Claims whose lease has run out (by the database clock) and that no delivery has
/// taken over yet: their holder may have died; the next delivery of each is a
/// takeover. Longest expired first. Parameters: $1 limit.
pub const STALE_CLAIMS_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE status = 'claimed' AND lease_expires_at <= now()
 ORDER BY lease_expires_at, job_type, operation_key
 LIMIT $1"#;

/// The distinct job types, in order, by a loose scan of the primary key (one index
/// probe per job type, however many records each has). Parameters: $1 limit.
pub const JOB_TYPES_SQL: &str = r#"
WITH RECURSIVE types(job_type) AS (
    (SELECT job_type FROM idempotent_job_records ORDER BY job_type LIMIT 1)
    UNION ALL
    SELECT (SELECT r.job_type FROM idempotent_job_records r
             WHERE r.job_type > types.job_type ORDER BY r.job_type LIMIT 1)
      FROM types
     WHERE types.job_type IS NOT NULL)
SELECT job_type FROM types WHERE job_type IS NOT NULL LIMIT $1"#;

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

/// What `/metrics` reports per job type, read from the table in one statement (so
/// every process answers the same), aggregated over the whole table: records by
/// status; live and stale claims; the age in seconds of the oldest held operation (0
/// when none is held); the repeated deliveries recorded in the last hour (each
/// record keeps its last 20 repeat times, so an operation counts at most 20) and the
/// operations they belong to; and the purge backlog: finished records (completed or
/// given up) that finished more than $1 seconds ago, the retention — what
/// [`crate::sql::PURGE_SQL`] would delete with the same age. Parameters: $1
/// retention in seconds.
pub const METRICS_SQL: &str = r#"
SELECT job_type,
       count(*) FILTER (WHERE status = 'claimed') AS claimed,
       count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status = 'released') AS released,
       count(*) FILTER (WHERE status = 'held') AS held,
       count(*) FILTER (WHERE status = 'given_up') AS given_up,
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at > now()) AS live_claims,
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at <= now()) AS stale_claims,
       coalesce(extract(epoch FROM now() - min(held_at) FILTER (WHERE status = 'held')), 0)::float8
           AS oldest_held_seconds,
       coalesce(sum((SELECT count(*) FROM unnest(repeat_times) AS t(at)
                      WHERE t.at >= now() - interval '1 hour')), 0)::int8 AS repeats_last_hour,
       count(*) FILTER (WHERE repeat_times[cardinality(repeat_times)] >= now() - interval '1 hour')
           AS repeated_operations_last_hour,
       count(*) FILTER (WHERE status IN ('completed', 'given_up')
                          AND coalesce(completed_at, given_up_at) < now() - make_interval(secs => $1))
           AS purge_backlog
  FROM idempotent_job_records
 GROUP BY job_type
 ORDER BY job_type"#;

/// One job type's row of [`METRICS_SQL`]: counts of records, and the oldest held
/// operation's age in seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobTypeMetrics {
    pub job_type: String,
    /// Records by status, in [`STATUSES`] order.
    pub records: [i64; 5],
    pub live_claims: i64,
    pub stale_claims: i64,
    /// Seconds since the oldest held operation was held; 0 when none is.
    pub oldest_held_seconds: f64,
    pub repeats_last_hour: i64,
    pub repeated_operations_last_hour: i64,
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
                repeats_last_hour: row.try_get("repeats_last_hour")?,
                repeated_operations_last_hour: row.try_get("repeated_operations_last_hour")?,
                purge_backlog: row.try_get("purge_backlog")?,
            })
        })
        .collect()
}

/// The metric families of [`exposition`]: name, help text. Every one is a gauge.
pub const METRIC_FAMILIES: [(&str, &str); 7] = [
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
            let _ = writeln!(out, "{name} {retention_seconds}");
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
                    sample(String::new(), row.oldest_held_seconds.to_string())
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
