//! Records, read and settled outside a delivery: find one, the completed check,
//! held operations, resolve, purge (retention) and the repeats report. Each statement's
//! text is in [`crate::sql`] (the record's read, `FIND_SQL`, and the resolve that answers
//! the record, `RESOLVE_SQL`, in [`crate::record`]).

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::record::{Record, FIND_SQL, RESOLVE_SQL};
use crate::sql::{
    COMPLETED_SQL, HELD_SQL, NO_STORED_JOB_SQL, PURGE_PLAN_RESET_SQL, PURGE_PLAN_SQL, PURGE_SQL,
    REPEATS_SQL,
};

/// Reads one record, or `None` when the operation was never claimed. Sent like the
/// claim (see [`Conn::query_own`]).
///
/// Errors: connection/database errors.
pub async fn find(conn: &Conn, job_type: &str, operation_key: &str) -> Result<Option<Record>> {
    match find_row(conn, job_type, operation_key).await? {
        Some(row) => Record::from_row(&row).map(Some),
        None => Ok(None),
    }
}

/// The record's row as `FIND_SQL` reads it, or `None` when the operation was never
/// claimed: [`find`]'s and [`find_listed`]'s one statement.
async fn find_row(
    conn: &Conn,
    job_type: &str,
    operation_key: &str,
) -> Result<Option<tokio_postgres::Row>> {
    let rows = conn
        .query_own(
            FIND_SQL,
            &[(&job_type, Type::TEXT), (&operation_key, Type::TEXT)],
        )
        .await?;
    Ok(rows.into_iter().next())
}

/// A record as a list shows it ([`find_listed`]): read, or marked as one the core
/// cannot read (a time edited by hand to `'infinity'`), so one such record does not
/// hide the others; its own read ([`find`]) stays the error.
#[derive(Debug)]
pub enum Listed {
    /// The record, read.
    Read(Box<Record>),
    /// The record cannot be read: `column` is the first column that cannot, `error`
    /// the [`Error::Unreadable`] its own read raises (naming the record and the column).
    Unreadable {
        /// The column's name ([`Record::COLUMNS`]).
        column: &'static str,
        /// The error [`find`] gives for it.
        error: Error,
    },
}

/// Reads one record for a list ([`find`], but a record the core cannot read is
/// [`Listed::Unreadable`], not an error), or `None` when the operation was never claimed.
///
/// Errors: connection/database errors.
pub async fn find_listed(
    conn: &Conn,
    job_type: &str,
    operation_key: &str,
) -> Result<Option<Listed>> {
    let Some(row) = find_row(conn, job_type, operation_key).await? else {
        return Ok(None);
    };
    match Record::from_row(&row) {
        Ok(record) => Ok(Some(Listed::Read(Box::new(record)))),
        Err(error @ Error::Unreadable(_)) => Ok(Some(Listed::Unreadable {
            column: Record::unreadable_column(&row).unwrap_or("?"),
            error,
        })),
        Err(error) => Err(error),
    }
}

/// Whether the operation's record is completed (see [`COMPLETED_SQL`]): one round
/// trip, nothing written.
///
/// Errors: connection/database errors.
pub async fn completed(conn: &Conn, job_type: &str, operation_key: &str) -> Result<bool> {
    let rows = conn
        .query_own(
            COMPLETED_SQL,
            &[(&job_type, Type::TEXT), (&operation_key, Type::TEXT)],
        )
        .await?;
    match rows.first() {
        Some(row) => Ok(row.try_get(0)?),
        None => Ok(false),
    }
}

/// Keys of held operations, oldest first: `(job_type, operation_key)` pairs.
pub async fn held(
    client: &Client,
    job_type: Option<&str>,
    limit: i64,
) -> Result<Vec<(String, String)>> {
    let result = client
        .query_typed(HELD_SQL, &[(&job_type, Type::TEXT), (&limit, Type::INT8)])
        .await;
    result?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// Where a purge stands: the `first_claimed_at` index key (V10) of the last record a
/// batch took (first claim time, job type, operation key). [`PurgeCursor::default`] is
/// the start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeCursor {
    /// The last record's first claim time (`first_claimed_at`); None at the start.
    pub first_claimed_at: Option<DateTime<Utc>>,
    /// The last record's job type ("" at the start).
    pub job_type: String,
    /// The last record's operation key ("" at the start).
    pub operation_key: String,
}

/// What one purge batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeBatch {
    /// Records deleted.
    pub deleted: u64,
    /// Records the batch locked (all due records after the cursor, up to the batch size,
    /// but those a claim had locked). Fewer than the batch size: the purge is done.
    /// `deleted` is below it only when a picked record stopped being due meanwhile.
    pub picked: u64,
    /// Where the next batch starts (the cursor given, when nothing was picked).
    pub next: PurgeCursor,
}

/// The refusal of a purge's age `older_than` and batch `batch` (each as the binding
/// shows the value it was given): an age below 0, not finite or not a number (a binding
/// refuses `true` or `"30"` with it), a batch below 1 or not a whole number (a binding
/// refuses a batch of `1.5`, `"5"` or `true` with it before calling [`purge_batch`]).
pub fn purge_refused(older_than: &str, batch: &str) -> Error {
    Error::Config(format!(
        "purge needs older_than >= 0 seconds and a batch of at least 1, got {older_than} and {batch}"
    ))
}

/// PostgreSQL's first `timestamptz` (4714-11-24 00:00:00 UTC BC), in epoch seconds: an
/// earlier time is refused by the server (SQLSTATE 22008), though chrono (and so each
/// binding's time) reaches back to the year -262143.
pub const POSTGRES_FIRST_SECOND: i64 = -210_866_803_200;

/// The greatest age in seconds a purge sends PostgreSQL: from its first timestamp
/// ([`POSTGRES_FIRST_SECOND`]) to now, less a
/// day (the server's `now()` may run ahead of this process's clock). A purge of records
/// older than that deletes nothing ([`purge_batch`]).
fn oldest_age() -> f64 {
    (Utc::now().timestamp() - POSTGRES_FIRST_SECOND - 86_400) as f64
}

/// Deletes one batch of at most `batch` finished records older than
/// `older_than_seconds`, after `after` in the `first_claimed_at` index's order (see
/// [`PURGE_SQL`]). A purge passes each batch's [`PurgeBatch::next`] to the next batch
/// and stops when a batch picks fewer than `batch`: its time then grows with the number
/// of records deleted, not with its square. Records skipped because a claim had them
/// locked are behind the cursor: the next purge (from the start) takes them.
/// An age reaching before PostgreSQL's first timestamp (`2**64` seconds) deletes nothing.
/// Errors: [`Error::Config`] for a negative or non-finite age or a batch below 1;
/// connection and statement errors as [`Error`].
pub async fn purge_batch(
    client: &Client,
    older_than_seconds: f64,
    batch: i64,
    after: &PurgeCursor,
) -> Result<PurgeBatch> {
    if !(older_than_seconds >= 0.0 && older_than_seconds.is_finite()) || batch < 1 {
        return Err(purge_refused(
            &older_than_seconds.to_string(),
            &batch.to_string(),
        ));
    }
    if older_than_seconds > oldest_age() {
        // Older than PostgreSQL's first timestamp (4714-11-24 BC): no record is, and the
        // statement's `now() - make_interval(secs => $1)` would be out of range (22008).
        return Ok(PurgeBatch {
            deleted: 0,
            picked: 0,
            next: after.clone(),
        });
    }
    let start = after.first_claimed_at.is_some();
    let job_type = start.then_some(after.job_type.as_str());
    let operation_key = start.then_some(after.operation_key.as_str());
    // The plan settings, the batch and the reset are queued together (polled in this
    // order, `biased`, each sends at its first poll) and answered in order: one round
    // trip instead of three. The reset runs whatever the batch
    // answered (each is its own protocol exchange), and the plan settings' error, if
    // any, is the one reported.
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&older_than_seconds, Type::FLOAT8),
        (&batch, Type::INT8),
        (&after.first_claimed_at, Type::TIMESTAMPTZ),
        (&job_type, Type::TEXT),
        (&operation_key, Type::TEXT),
    ];
    let (planned, row, reset) = tokio::join!(
        biased;
        client.batch_execute(PURGE_PLAN_SQL),
        client.query_typed(PURGE_SQL, &params),
        client.batch_execute(PURGE_PLAN_RESET_SQL),
    );
    planned?;
    let row = row?;
    reset?;
    let row = row
        .first()
        .ok_or_else(|| Error::connection("the purge statement returned no row"))?;
    let deleted: i64 = row.try_get(0)?;
    let picked: i64 = row.try_get(1)?;
    let first_claimed_at: Option<DateTime<Utc>> = row.try_get(2)?;
    let next = match first_claimed_at {
        Some(at) => PurgeCursor {
            first_claimed_at: Some(at),
            job_type: row.try_get(3)?,
            operation_key: row.try_get(4)?,
        },
        None => after.clone(),
    };
    Ok(PurgeBatch {
        deleted: deleted as u64,
        picked: picked as u64,
        next,
    })
}

/// One row of [`REPEATS_SQL`].
#[derive(Debug, Clone)]
pub struct Repeated {
    /// The record's job type.
    pub job_type: String,
    /// The record's operation key.
    pub operation_key: String,
    /// The record's status now (`claimed`, `completed`, …).
    pub status: String,
    /// Claims made on the record.
    pub attempts: i32,
    /// Stale claims taken over.
    pub takeovers: i32,
    /// Duplicate deliveries (each copy counted once, on its first arrival).
    pub duplicates: i32,
    /// Deliveries whose arguments differed from the claim's.
    pub mismatches: i32,
    /// When the first claim was made.
    pub first_claimed_at: DateTime<Utc>,
    /// When the repeats came, oldest first (the latest ones only: a bounded list).
    pub repeat_times: Vec<DateTime<Utc>>,
    /// The job classes that delivered the operation.
    pub job_classes: Vec<String>,
    /// The last claiming delivery's id.
    pub delivery_id: Option<String>,
    /// When the completion was recorded, if it was.
    pub completed_at: Option<DateTime<Utc>>,
    /// The first claiming delivery's facts as JSON text, when it sent some.
    pub first_facts: Option<String>,
    /// The `repeat_facts` array as JSON text.
    pub repeat_facts: String,
}

/// Operations repeated since `since` (see [`REPEATS_SQL`]).
pub async fn repeats(
    client: &Client,
    since: DateTime<Utc>,
    job_type: Option<&str>,
) -> Result<Vec<Repeated>> {
    let rows = client
        .query_typed(
            REPEATS_SQL,
            &[(&since, Type::TIMESTAMPTZ), (&job_type, Type::TEXT)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            // A value no time holds (edited to 'infinity') names the record and column.
            fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
                row: &'a tokio_postgres::Row,
                name: &str,
            ) -> Result<T> {
                row.try_get(name)
                    .map_err(|e| crate::record::unreadable_column(row, name, &e))
            }
            Ok(Repeated {
                job_type: get(row, "job_type")?,
                operation_key: get(row, "operation_key")?,
                status: get(row, "status")?,
                attempts: get(row, "attempts")?,
                takeovers: get(row, "takeovers")?,
                duplicates: get(row, "duplicates")?,
                mismatches: get(row, "mismatches")?,
                first_claimed_at: get(row, "first_claimed_at")?,
                repeat_times: get(row, "repeat_times")?,
                job_classes: get(row, "job_classes")?,
                delivery_id: get(row, "jid")?,
                completed_at: get(row, "completed_at")?,
                first_facts: get(row, "first_facts")?,
                repeat_facts: get(row, "repeat_facts")?,
            })
        })
        .collect()
}

/// How a person settles a held or given-up operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The effect is known to have happened: mark the operation completed.
    Done,
    /// Run it again: the record is released for the next delivery.
    Rerun,
}

/// The delivery a settled operation's last claim stored: what a rerun re-sends through
/// its queue (each door translates it: Sidekiq pushes `job_class` with `args` on
/// `queue`, Celery sends the task by name, a plain or SQS caller's hook re-sends it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDelivery {
    /// The job type (idempotency scope).
    pub job_type: String,
    /// The operation key as stored.
    pub operation_key: String,
    /// The last claiming delivery's job class (a Celery task's name), if it gave one.
    pub job_class: Option<String>,
    /// Its queue (Sidekiq queue, Celery routing key, SQS queue URL), if it gave one.
    pub queue: Option<String>,
    /// Its arguments (payload) as JSON text, if stored.
    pub args_json: Option<String>,
    /// The first claim's facts (a JSON object text), if any.
    pub first_facts_json: Option<String>,
}

/// What settling an operation answers, from the one statement that settled it
/// ([`RESOLVE_SQL`]): the record after the change and the stored delivery of its last
/// claim.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The record as the resolve left it (`completed` or `released`).
    pub record: Record,
    /// What a rerun re-sends.
    pub delivery: StoredDelivery,
}

/// Settles a held or given-up operation. Returns its record after the change and the
/// stored delivery of its last claim ([`Resolved`]), or `None` when no such operation is
/// held or given up (never claimed, or settled already, or claimed since it was
/// released): the statement's own `WHERE` decides, so two resolves of one operation (or a
/// resolve and a delivery) never both see it settleable. One statement ([`RESOLVE_SQL`]);
/// a rerun that settled nothing reads once more ([`NO_STORED_JOB_SQL`]) for its error.
///
/// Errors: [`Error::Config`] for a rerun of a record that holds no stored job (its job
/// class and arguments are written by the takeover a hold or a give-up follows; a record
/// held by hand has none): the record stays as it was;
/// [`Error::Unreadable`] for a record the core cannot read, read before the change (it
/// stays as it was); connection and database errors.
pub async fn resolve_record(
    client: &Client,
    job_type: &str,
    operation_key: &str,
    resolution: Resolution,
) -> Result<Option<Resolved>> {
    let name = match resolution {
        Resolution::Done => "done",
        Resolution::Rerun => "rerun",
    };
    // A record the core cannot read (a time edited to 'infinity') is refused before it is
    // changed: the statement below would settle it and only its answer be unreadable (the
    // caller told of an error while the record was completed, or released with its rerun
    // never re-sent).
    let found = client
        .query_typed(
            FIND_SQL,
            &[(&job_type, Type::TEXT), (&operation_key, Type::TEXT)],
        )
        .await?;
    if let Some(row) = found.first() {
        Record::from_row(row)?;
    }
    let rows = client
        .query_typed(
            RESOLVE_SQL,
            &[
                (&job_type, Type::TEXT),
                (&operation_key, Type::TEXT),
                (&name, Type::TEXT),
            ],
        )
        .await?;
    if rows.is_empty() && resolution == Resolution::Rerun {
        let missing = client
            .query_typed(
                NO_STORED_JOB_SQL,
                &[(&job_type, Type::TEXT), (&operation_key, Type::TEXT)],
            )
            .await?;
        if let Some(row) = missing.first() {
            let status: String = row.try_get(0)?;
            return Err(Error::Config(format!(
                "cannot rerun {job_type} operation {operation_key:?}: the record ({status}) \
                 holds no stored job (no job class and no arguments: a record is held or given \
                 up by the delivery that took its stale claim over, which stores its job; this \
                 one was not), so there is nothing to re-send; it stays {status} (resolve it as \
                 done once its effect is known to have happened)"
            )));
        }
    }
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let record = Record::from_row(row)?;
    let delivery = StoredDelivery {
        job_type: record.job_type.clone(),
        operation_key: record.operation_key.clone(),
        job_class: record.job_class.clone(),
        queue: record.queue.clone(),
        args_json: record.args_json.clone(),
        first_facts_json: row.try_get("first_facts")?,
    };
    Ok(Some(Resolved { record, delivery }))
}

/// [`resolve_record`], answering only the stored delivery (what a rerun re-sends), or
/// `None` when the operation is not held or given up.
///
/// Errors: as [`resolve_record`].
pub async fn resolve_stored(
    client: &Client,
    job_type: &str,
    operation_key: &str,
    resolution: Resolution,
) -> Result<Option<StoredDelivery>> {
    Ok(resolve_record(client, job_type, operation_key, resolution)
        .await?
        .map(|resolved| resolved.delivery))
}

/// Settles a held or given-up operation ([`resolve_record`], answering only whether it
/// did). Returns false when no such operation is held or given up (never claimed, or
/// already settled).
///
/// Errors: as [`resolve_record`] ([`Error::Config`] for a rerun of a record that holds no
/// stored job); connection/database errors.
pub async fn resolve(
    client: &Client,
    job_type: &str,
    operation_key: &str,
    resolution: Resolution,
) -> Result<bool> {
    Ok(resolve_record(client, job_type, operation_key, resolution)
        .await?
        .is_some())
}
