//! The shape of the record table, checked once per process before the first claim.
//!
//! A table that drifted from the migrations (a column dropped or renamed by hand, a
//! restore of an old dump) would let a claim succeed and then fail the completion or
//! the lease renewals, so a job body would run again at every delivery. Before the
//! first claim of a process (and again after any failed check) the table's columns
//! are compared with [`COLUMNS`]; a table that lacks any of them is refused with an
//! error naming the missing columns, and no body runs.

use std::sync::atomic::Ordering;

use tokio_postgres::Client;

use crate::conn::Conn;
use crate::error::{claim_failure, Error, Result, DRIFTED};
use crate::sql::COLUMNS_SQL;

/// Every column the gem's statements read or write, as the migrations create them.
/// A new migration that adds a column the statements use adds it here too (a cargo
/// test compares this list with the migrated table).
pub const COLUMNS: [&str; 35] = [
    "job_type",
    "operation_key",
    "status",
    "claim_token",
    "attempts",
    "takeovers",
    "last_claim",
    "jid",
    "duplicates",
    "last_duplicate_at",
    "first_claimed_at",
    "claimed_at",
    "lease_seconds",
    "lease_expires_at",
    "completed_at",
    "released_at",
    "last_error",
    "updated_at",
    "args_digest",
    "job_class",
    "queue",
    "args",
    "mismatches",
    "last_mismatch",
    "heartbeat_at",
    "held_at",
    "given_up_at",
    "resolution",
    "resolved_at",
    "repeat_times",
    "job_classes",
    "repeat_facts",
    "first_facts",
    "result",
    "result_state",
];

/// The columns of [`COLUMNS`] the table lacks, in [`COLUMNS`]' order; `None` when the
/// table does not exist (the migrations never ran).
///
/// Errors: connection/database errors.
pub async fn missing_columns(client: &Client) -> Result<Option<Vec<&'static str>>> {
    // Unnamed (one round trip, nothing left prepared: PgBouncer in transaction mode).
    let rows = client.query_typed(COLUMNS_SQL, &[]).await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let present: Vec<String> = rows
        .iter()
        .map(|r| r.try_get::<_, String>(0))
        .collect::<std::result::Result<_, _>>()?;
    Ok(Some(
        COLUMNS
            .iter()
            .copied()
            .filter(|c| !present.iter().any(|p| p == c))
            .collect(),
    ))
}

/// Checks the table once for the process that owns `conn`'s pool (the pool remembers
/// a success; a failure is checked again at the next claim, so a repaired table is
/// used without a restart). `job_type` and `operation_key` name the delivery in the
/// error.
///
/// Errors: [`Error::Database`] with SQLSTATE 42703 naming the missing columns, or
/// 42P01 when the table is missing; connection errors.
pub async fn ensure(conn: &Conn, job_type: &str, operation_key: &str) -> Result<()> {
    if conn.schema_checked().load(Ordering::Acquire) {
        return Ok(());
    }
    let what = claim_failure(job_type, operation_key);
    match missing_columns(conn).await? {
        None => Err(Error::Database {
            message: format!(
                "{what}: the table idempotent_job_records does not exist: apply the \
                 migrations; no job body was run"
            ),
            sqlstate: "42P01".into(),
        }),
        Some(missing) if !missing.is_empty() => Err(Error::Database {
            message: format!(
                "{what}: the table idempotent_job_records {DRIFTED} from the migrations and \
                 cannot record claims and completions (missing column{} {}); no job body \
                 runs until it is repaired: apply the migrations, and if they report the \
                 schema current, restore the columns as the migrations' statements create them",
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", ")
            ),
            sqlstate: "42703".into(),
        }),
        Some(_) => {
            conn.schema_checked().store(true, Ordering::Release);
            Ok(())
        }
    }
}

/// After the migrations ran: an error when the table still lacks columns (they were
/// dropped by hand after the migration that created them was recorded, so refinery
/// has nothing to apply).
///
/// Errors: [`Error::Migration`] naming the missing columns; connection errors.
pub async fn check_after_migrate(client: &Client) -> Result<()> {
    match missing_columns(client).await? {
        Some(missing) if !missing.is_empty() => Err(Error::Migration(format!(
            "every migration is recorded as applied, but the table idempotent_job_records \
             {DRIFTED}: it lacks the column{} {} (dropped or renamed by hand?); claims are refused \
             until they are restored as the migrations' statements create them",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", ")
        ))),
        _ => Ok(()),
    }
}
