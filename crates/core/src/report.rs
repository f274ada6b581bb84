//! Read-only lists for operators (the web page, `IdempotentJob::Web`): given-up
//! operations, records of one job type, recent takeovers, stale claims and the job
//! types present. Each list returns keys; the caller reads each record with
//! [`super::claim::FIND_SQL`], so the record has one definition. Nothing here writes.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use super::error::{Error, Result};

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
