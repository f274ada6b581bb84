//! The claim protocol: one SQL text per operation, and the decision it returns.
//!
//! A delivery's decision is made by ONE statement ([`CLAIM_SQL`]) in one round trip:
//! PostgreSQL's `INSERT … ON CONFLICT DO UPDATE` takes the row lock, so concurrent
//! deliveries of one operation are serialised by the database and each sees the
//! outcome of the one before. All lease arithmetic uses the database's `now()`.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use super::error::{Error, Result};
use super::store::Conn;

/// Longest `job_type` + `operation_key`, in bytes, that the unique index accepts
/// with room to spare (a btree entry must fit in a third of a page).
pub const MAX_KEY_BYTES: usize = 2000;

/// Claim, or count a duplicate, in one statement.
///
/// * no record: insert it as `claimed` with the caller's token (a first claim);
/// * `released` (the last holder's job raised), or `claimed` with an expired lease
///   (the holder may have died): take it over with the caller's token, `attempts`+1;
/// * otherwise (`completed`, or `claimed` with a live lease): change nothing but
///   `duplicates`+1 and `last_duplicate_at`.
///
/// `won` in the result tells the caller whether its token is now the record's.
/// Parameters: $1 job_type, $2 operation_key, $3 claim_token (uuid), $4 jid,
/// $5 lease in seconds (float8).
pub const CLAIM_SQL: &str = r#"
INSERT INTO idempotent_job_records AS r
    (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at)
VALUES ($1, $2, 'claimed', $3, $4, $5, now() + make_interval(secs => $5))
ON CONFLICT (job_type, operation_key) DO UPDATE SET
    (status, claim_token, jid, attempts, takeovers, last_claim, claimed_at,
     lease_seconds, lease_expires_at, duplicates, last_duplicate_at, updated_at) =
    (SELECT CASE WHEN d.take THEN 'claimed' ELSE r.status END,
            CASE WHEN d.take THEN excluded.claim_token ELSE r.claim_token END,
            CASE WHEN d.take THEN excluded.jid ELSE r.jid END,
            r.attempts + d.take::int,
            r.takeovers + (d.take AND r.status = 'claimed')::int,
            CASE WHEN NOT d.take THEN r.last_claim
                 WHEN r.status = 'claimed' THEN 'takeover'
                 ELSE 'retry' END,
            CASE WHEN d.take THEN now() ELSE r.claimed_at END,
            CASE WHEN d.take THEN excluded.lease_seconds ELSE r.lease_seconds END,
            CASE WHEN d.take THEN excluded.lease_expires_at ELSE r.lease_expires_at END,
            r.duplicates + (NOT d.take)::int,
            CASE WHEN d.take THEN r.last_duplicate_at ELSE now() END,
            now()
       FROM (SELECT r.status = 'released'
                    OR (r.status = 'claimed' AND r.lease_expires_at <= now()) AS take) AS d)
RETURNING r.claim_token = $3 AS won, r.status, r.last_claim, r.attempts, r.jid,
          r.duplicates,
          EXTRACT(EPOCH FROM r.lease_expires_at - now())::float8 AS lease_remaining"#;

/// Mark a claim completed, only while the caller's token is still the record's.
/// Parameters: $1 job_type, $2 operation_key, $3 claim_token.
pub const COMPLETE_SQL: &str = r#"
UPDATE idempotent_job_records
   SET status = 'completed', completed_at = now(), updated_at = now()
 WHERE job_type = $1 AND operation_key = $2 AND claim_token = $3 AND status = 'claimed'"#;

/// Give a claim back after the job raised, only while the caller's token is still the
/// record's; the next delivery (Sidekiq's retry) claims again at once.
/// Parameters: $1 job_type, $2 operation_key, $3 claim_token, $4 error text.
pub const RELEASE_SQL: &str = r#"
UPDATE idempotent_job_records
   SET status = 'released', released_at = now(), last_error = $4, updated_at = now()
 WHERE job_type = $1 AND operation_key = $2 AND claim_token = $3 AND status = 'claimed'"#;

/// Read one record. Parameters: $1 job_type, $2 operation_key.
pub const FIND_SQL: &str = r#"
SELECT job_type, operation_key, status, claim_token, attempts, takeovers, last_claim, jid,
       duplicates, lease_seconds, last_error,
       first_claimed_at, claimed_at, lease_expires_at, completed_at, released_at,
       last_duplicate_at, updated_at,
       lease_expires_at <= now() AS lease_expired
  FROM idempotent_job_records
 WHERE job_type = $1 AND operation_key = $2"#;

/// One delivery's request for a claim. Owned, so it can cross into a runtime
/// thread while the caller's language runtime goes on.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The job type (idempotency scope), e.g. `"ChargeOrderJob"`.
    pub job_type: String,
    /// The canonical operation key, e.g. `"42"`.
    pub operation_key: String,
    /// The delivering job's id, stored as the record's last claiming jid.
    pub jid: Option<String>,
    /// Lease length in seconds (> 0).
    pub lease_seconds: f64,
}

/// How a won claim was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// No record existed: the first delivery of this operation.
    First,
    /// The previous holder's job raised and released its claim (a Sidekiq retry).
    Retry,
    /// The previous claim's lease had expired: its holder may have died. Its effect
    /// may or may not have happened (a stale claim).
    Takeover,
}

impl ClaimKind {
    /// The name stored in `last_claim`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::First => "first",
            ClaimKind::Retry => "retry",
            ClaimKind::Takeover => "takeover",
        }
    }
}

/// What a delivery should do, decided atomically by [`claim`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Run the job. `token` must be presented to [`complete`] / [`release`].
    Claimed {
        token: Uuid,
        /// Claims made on this record, this one included (1 for a first claim).
        attempt: i32,
        kind: ClaimKind,
    },
    /// The operation already completed: do not run. `duplicates` counts this one.
    Completed { duplicates: i32 },
    /// Another delivery holds a live claim: do not run now; try again once
    /// `lease_remaining` seconds have passed (by the database clock).
    InProgress {
        holder_jid: Option<String>,
        attempt: i32,
        lease_remaining: f64,
        duplicates: i32,
    },
}

/// A whole idempotency record, as stored. Times are UTC.
#[derive(Debug, Clone)]
pub struct Record {
    pub job_type: String,
    pub operation_key: String,
    pub status: String,
    pub claim_token: Uuid,
    pub attempts: i32,
    pub takeovers: i32,
    pub last_claim: String,
    pub jid: Option<String>,
    pub duplicates: i32,
    pub lease_seconds: f64,
    pub last_error: Option<String>,
    pub first_claimed_at: DateTime<Utc>,
    pub claimed_at: DateTime<Utc>,
    pub lease_expires_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub released_at: Option<DateTime<Utc>>,
    pub last_duplicate_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// Whether `lease_expires_at` has passed, by the database clock.
    pub lease_expired: bool,
}

fn check_key(job_type: &str, operation_key: &str) -> Result<()> {
    if job_type.is_empty() {
        return Err(Error::Config("job_type must not be empty".into()));
    }
    if operation_key.is_empty() {
        return Err(Error::Config(format!(
            "the operation key of {job_type} must not be empty"
        )));
    }
    if job_type.len() + operation_key.len() > MAX_KEY_BYTES {
        return Err(Error::Config(format!(
            "the operation key of {job_type} is {} bytes; job type and key together must \
             stay under {MAX_KEY_BYTES} bytes (declare a narrower idempotency_key)",
            operation_key.len()
        )));
    }
    Ok(())
}

/// Decides one delivery in one round trip (see [`CLAIM_SQL`]).
///
/// Errors: [`Error::Config`] for an empty/oversized key or a non-positive lease,
/// [`Error::Connection`] / [`Error::Database`] from PostgreSQL.
pub async fn claim(conn: &mut Conn, req: &ClaimRequest) -> Result<Outcome> {
    check_key(&req.job_type, &req.operation_key)?;
    if !req.lease_seconds.is_finite() || req.lease_seconds <= 0.0 {
        return Err(Error::Config(format!(
            "the lease of {} must be a positive number of seconds, got {}",
            req.job_type, req.lease_seconds
        )));
    }
    let token = Uuid::new_v4();
    let result = conn
        .query_typed(
            CLAIM_SQL,
            &[
                (&req.job_type, Type::TEXT),
                (&req.operation_key, Type::TEXT),
                (&token, Type::UUID),
                (&req.jid, Type::TEXT),
                (&req.lease_seconds, Type::FLOAT8),
            ],
        )
        .await;
    conn.finish();
    let rows = result?;
    let row = rows
        .first()
        .ok_or_else(|| Error::connection("the claim statement returned no row"))?;
    let won: bool = row.try_get("won")?;
    let status: String = row.try_get("status")?;
    let attempt: i32 = row.try_get("attempts")?;
    let duplicates: i32 = row.try_get("duplicates")?;
    if won {
        let kind = match row.try_get::<_, String>("last_claim")?.as_str() {
            "takeover" => ClaimKind::Takeover,
            "retry" => ClaimKind::Retry,
            _ => ClaimKind::First,
        };
        return Ok(Outcome::Claimed {
            token,
            attempt,
            kind,
        });
    }
    match status.as_str() {
        "completed" => Ok(Outcome::Completed { duplicates }),
        "claimed" => Ok(Outcome::InProgress {
            holder_jid: row.try_get("jid")?,
            attempt,
            lease_remaining: row.try_get::<_, f64>("lease_remaining")?.max(0.0),
            duplicates,
        }),
        other => Err(Error::Database {
            message: format!(
                "idempotency record {}/{} has status {other:?}, which this version of \
                 idempotent_job does not know (run the latest migrations and gem)",
                req.job_type, req.operation_key
            ),
            sqlstate: "XX000".into(),
        }),
    }
}

async fn update_claim(
    conn: &mut Conn,
    sql: &str,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    extra: Option<&str>,
    verb: &str,
) -> Result<()> {
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
        (&job_type, Type::TEXT),
        (&operation_key, Type::TEXT),
        (&token, Type::UUID),
    ];
    if let Some(text) = &extra {
        params.push((text, Type::TEXT));
    }
    let result = conn.execute_typed(sql, &params).await;
    conn.finish();
    match result? {
        1 => Ok(()),
        _ => Err(Error::LostClaim {
            job_type: job_type.to_string(),
            operation_key: operation_key.to_string(),
            message: format!(
                "cannot {verb} {job_type} operation {operation_key:?}: claim {token} is no \
                 longer held (its lease ran out and another delivery took the operation over)"
            ),
        }),
    }
}

/// Marks the claim `token` completed.
///
/// Errors: [`Error::LostClaim`] when `token` is no longer the record's (the lease
/// expired and another delivery took over); connection/database errors.
pub async fn complete(
    conn: &mut Conn,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
) -> Result<()> {
    update_claim(
        conn,
        COMPLETE_SQL,
        job_type,
        operation_key,
        token,
        None,
        "complete",
    )
    .await
}

/// Releases the claim `token` after the job raised; `error` (class and message) is
/// stored in `last_error`.
///
/// Errors: [`Error::LostClaim`] when `token` is no longer the record's;
/// connection/database errors.
pub async fn release(
    conn: &mut Conn,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    error: &str,
) -> Result<()> {
    update_claim(
        conn,
        RELEASE_SQL,
        job_type,
        operation_key,
        token,
        Some(error),
        "release",
    )
    .await
}

/// Reads one record, or `None` when the operation was never claimed.
pub async fn find(conn: &mut Conn, job_type: &str, operation_key: &str) -> Result<Option<Record>> {
    let result = conn
        .query_typed(
            FIND_SQL,
            &[(&job_type, Type::TEXT), (&operation_key, Type::TEXT)],
        )
        .await;
    conn.finish();
    let Some(row) = result?.into_iter().next() else {
        return Ok(None);
    };
    Ok(Some(Record {
        job_type: row.try_get("job_type")?,
        operation_key: row.try_get("operation_key")?,
        status: row.try_get("status")?,
        claim_token: row.try_get("claim_token")?,
        attempts: row.try_get("attempts")?,
        takeovers: row.try_get("takeovers")?,
        last_claim: row.try_get("last_claim")?,
        jid: row.try_get("jid")?,
        duplicates: row.try_get("duplicates")?,
        lease_seconds: row.try_get("lease_seconds")?,
        last_error: row.try_get("last_error")?,
        first_claimed_at: row.try_get("first_claimed_at")?,
        claimed_at: row.try_get("claimed_at")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        completed_at: row.try_get("completed_at")?,
        released_at: row.try_get("released_at")?,
        last_duplicate_at: row.try_get("last_duplicate_at")?,
        updated_at: row.try_get("updated_at")?,
        lease_expired: row.try_get("lease_expired")?,
    }))
}
