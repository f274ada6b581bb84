//! Deliver and claim: the decision of one delivery, made by the database.
//!
//! A delivery's decision is made by ONE statement ([`CLAIM_SQL`]) in one round trip:
//! PostgreSQL's `INSERT … ON CONFLICT DO UPDATE` takes the row lock, so concurrent
//! deliveries of one operation are serialised by the database and each sees the
//! outcome of the one before. All lease arithmetic uses the database's `now()`.
//! Outside a transaction a delivery first looks ([`DELIVER_SQL`], [`deliver`]); the
//! row becomes a [`ClaimReply`] through [`decide`], the one place that reads it.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use crate::bookkeeping::{Bookkeeper, Repeat};
use crate::conn::{Conn, Interrupt};
use crate::error::{Error, Result};
use crate::pool::{with_fresh_conn, Lane};
use crate::record::{check_request, decide, ClaimReply, ClaimRequest, ClaimRow};
use crate::sql::{CLAIM_SQL, DELIVER_SQL, SETTLED_LOOK_SQL};
use crate::store::PoolHandle;

/// How many of [`claim_params`]' values the first-claim insert takes ($1–$8, numbered
/// alike in [`CLAIM_SQL`] and [`DELIVER_SQL`]): all of [`DELIVER_SQL`]'s parameters.
const FIRST_CLAIM_PARAMS: usize = 8;

/// [`CLAIM_SQL`]'s parameters $1–$12 for `req`, with `token` as $3; the first
/// [`FIRST_CLAIM_PARAMS`] are [`DELIVER_SQL`]'s.
fn claim_params<'a>(
    req: &'a ClaimRequest,
    token: &'a Uuid,
) -> [(&'a (dyn ToSql + Sync), Type); 12] {
    [
        (&req.job_type, Type::TEXT),
        (&req.operation_key, Type::TEXT),
        (token, Type::UUID),
        (&req.delivery_id, Type::TEXT),
        (&req.lease_seconds, Type::FLOAT8),
        (&req.args_digest, Type::TEXT),
        (&req.job_class, Type::TEXT),
        (&req.facts_json, Type::TEXT),
        (&req.queue, Type::TEXT),
        (&req.args_json, Type::TEXT),
        (&req.refuse_mismatch, Type::BOOL),
        (&req.returning, Type::BOOL),
    ]
}

/// The claim with the caller's fencing token `token` ([`CLAIM_SQL`]), and the database
/// time of the decision. Sending the same request again with the same token (its first
/// answer was lost with its connection) wins again if the first one won, so a claim is
/// safe to repeat on a fresh connection. Before the first claim of a process, a table
/// that lacks columns is refused ([`crate::schema::ensure`]).
async fn claim_at(
    conn: &Conn,
    req: &ClaimRequest,
    token: Uuid,
) -> Result<(ClaimReply, DateTime<Utc>)> {
    check_request(req)?;
    crate::schema::ensure(conn, &req.job_type, &req.operation_key).await?;
    let result = conn.query_own(CLAIM_SQL, &claim_params(req, &token)).await;
    let rows = result?;
    let row = rows
        .first()
        .ok_or_else(|| Error::connection("the claim statement returned no row"))?;
    let at = row.try_get("decided_at")?;
    let decision = decide(
        ClaimRow {
            won: row.try_get("won")?,
            status: row.try_get("status")?,
            last_claim: row.try_get("last_claim")?,
            attempts: row.try_get("attempts")?,
            delivery_id: row.try_get("jid")?,
            duplicates: row.try_get("duplicates")?,
            mismatch: row.try_get("mismatch")?,
            lease_remaining: row.try_get("lease_remaining")?,
            takeovers: row.try_get("takeovers")?,
            result: row.try_get("result")?,
            result_state: row.try_get("result_state")?,
        },
        token,
        req,
    )?;
    Ok((decision, at))
}

/// Decides one delivery outside a transaction, durably only when it must.
///
/// One statement first ([`DELIVER_SQL`]): with no record it makes the first claim
/// (durable, one round trip, as [`CLAIM_SQL`] would); when the operation is
/// completed, held, given up or claimed under a live lease, the record's state is
/// the answer and nothing is written (no transaction id, no WAL flush), and the
/// duplicate's bookkeeping is queued for the background writer
/// ([`crate::bookkeeping`]). Otherwise (released, a stale claim, or a concurrent
/// first claim that committed after the statement's snapshot) [`CLAIM_SQL`] decides,
/// durably: a takeover or a retry is never decided by the look, and the race never
/// yields a wrong answer. `duplicates` in a look's answer counts this delivery (not
/// a copy coming back: [`ClaimRequest::returning`]), those written, and this process's still queued (informative: a batch being written at
/// that moment may be missed or counted twice; the record's own count is exact).
/// On a read-only server (SQLSTATE 25006) a duplicate of a completed, held or given-up
/// operation is still answered, from a read (see [`SETTLED_LOOK_SQL`]).
///
/// Errors: [`Error::Config`] for an empty/oversized key or a non-positive lease,
/// [`Error::Connection`] / [`Error::Database`] / [`Error::Timeout`] from PostgreSQL,
/// naming the job and the operation ([`Error::naming_claim`]).
pub fn deliver(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    req: &ClaimRequest,
) -> Result<ClaimReply> {
    check_request(req)?;
    let books = pool.bookkeeper();
    // One token for every attempt: sent again on a fresh connection after its first
    // answer was lost, a claim that had won is found as this delivery's own.
    let token = Uuid::new_v4();
    let (decision, repeat) = with_fresh_conn(pool, interrupt, Lane::Main, async |c| {
        look_or_claim(c, req, token, books).await
    })
    .map_err(|e| e.naming_claim(&req.job_type, &req.operation_key))?;
    if let Some(repeat) = repeat {
        books.record(repeat);
    }
    Ok(decision)
}

async fn look_or_claim(
    conn: &Conn,
    req: &ClaimRequest,
    token: Uuid,
    books: &Bookkeeper,
) -> Result<(ClaimReply, Option<Repeat>)> {
    crate::schema::ensure(conn, &req.job_type, &req.operation_key).await?;
    let params = claim_params(req, &token);
    let rows = match conn
        .query_own(DELIVER_SQL, &params[..FIRST_CLAIM_PARAMS])
        .await
    {
        Err(e) if e.sqlstate() == Some("25006") => {
            return read_only_answer(conn, req, books, e).await
        }
        rows => rows?,
    };
    if let Some(row) = rows.first() {
        let inserted: bool = row.try_get("inserted")?;
        let status: String = row.try_get("status")?;
        let lease_remaining: f64 = row.try_get("lease_remaining")?;
        if !inserted && status == "claimed" && row.try_get::<_, bool>("mine")? {
            // This delivery's own claim, made by an attempt whose answer was lost.
            let decision = decide(
                ClaimRow {
                    won: true,
                    status,
                    last_claim: row.try_get("last_claim")?,
                    attempts: row.try_get("attempts")?,
                    delivery_id: row.try_get("jid")?,
                    duplicates: row.try_get("duplicates")?,
                    mismatch: false,
                    lease_remaining,
                    // The look does not read it: a claim whose answer was lost is
                    // not checked against the reclaim budget.
                    takeovers: 0,
                    result: None,
                    result_state: None,
                },
                token,
                req,
            )?;
            return Ok((decision, None));
        }
        let live = status == "claimed" && lease_remaining > 0.0;
        if inserted || live || matches!(status.as_str(), "completed" | "held" | "given_up") {
            let digest: Option<String> = row.try_get("args_digest")?;
            let mismatch =
                !inserted && matches!((&digest, &req.args_digest), (Some(a), Some(b)) if a != b);
            // Counted so far: what is written, what this process has still queued, and
            // this delivery unless it is a copy coming back, counted when it first
            // arrived (a batch being written at this moment may be counted twice or not
            // at all: the answer's count is informative, the record's is exact).
            // (saturating: a count at int4's maximum stays there, as the record's does)
            let duplicates: i32 = row.try_get::<_, i32>("duplicates")?.saturating_add(
                i32::try_from(books.pending(&req.job_type, &req.operation_key)).unwrap_or(i32::MAX),
            );
            let decision = decide(
                ClaimRow {
                    won: inserted,
                    status,
                    last_claim: "first".into(),
                    attempts: row.try_get("attempts")?,
                    delivery_id: row.try_get("jid")?,
                    duplicates: duplicates.saturating_add(i32::from(!inserted && !req.returning)),
                    mismatch,
                    lease_remaining,
                    takeovers: 0,
                    result: row.try_get("result")?,
                    result_state: row.try_get("result_state")?,
                },
                token,
                req,
            )?;
            let at = row.try_get("decided_at")?;
            let repeat = (!inserted).then(|| Repeat::new(req, &decision, at, true));
            return Ok((decision, repeat));
        }
    }
    claim_noting(conn, req, token).await
}

/// The answer to a delivery the server refused to decide because it is read-only
/// (`read_only`: SQLSTATE 25006, a failover in progress, a standby reached): a
/// duplicate of a completed, held or given-up operation needs only a read
/// ([`SETTLED_LOOK_SQL`]), so it is answered as the look would; its count is queued
/// for the bookkeeping, which keeps it until the server takes writes again
/// ([`crate::bookkeeping`]). Anything else (no record, a claim, a release) needs a
/// write: `read_only` is returned (retried on fresh connections until the deadline).
async fn read_only_answer(
    conn: &Conn,
    req: &ClaimRequest,
    books: &Bookkeeper,
    read_only: Error,
) -> Result<(ClaimReply, Option<Repeat>)> {
    let rows = conn
        .query_own(
            SETTLED_LOOK_SQL,
            &[
                (&req.job_type, Type::TEXT),
                (&req.operation_key, Type::TEXT),
            ],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Err(read_only);
    };
    let digest: Option<String> = row.try_get("args_digest")?;
    let mismatch = matches!((&digest, &req.args_digest), (Some(a), Some(b)) if a != b);
    // (saturating, as look_or_claim's: a count at int4's maximum stays there)
    let duplicates: i32 = row.try_get::<_, i32>("duplicates")?.saturating_add(
        i32::try_from(books.pending(&req.job_type, &req.operation_key)).unwrap_or(i32::MAX),
    );
    let decision = decide(
        ClaimRow {
            won: false,
            status: row.try_get("status")?,
            last_claim: "first".into(),
            attempts: row.try_get("attempts")?,
            delivery_id: row.try_get("jid")?,
            duplicates: duplicates.saturating_add(i32::from(!req.returning)),
            mismatch,
            lease_remaining: 0.0,
            takeovers: 0,
            result: row.try_get("result")?,
            result_state: row.try_get("result_state")?,
        },
        Uuid::nil(),
        req,
    )?;
    let at = row.try_get("decided_at")?;
    let repeat = Repeat::new(req, &decision, at, true);
    Ok((decision, Some(repeat)))
}

/// The claim with the caller's `token` ([`CLAIM_SQL`]), and the bookkeeping of its delivery when it is a repeat (anything but a
/// first claim): its `repeat_facts` entry, for the caller to queue
/// ([`Bookkeeper::record`]) once the decision is durable. [`CLAIM_SQL`] already counted
/// the repeat itself, so the entry adds no counts.
///
/// Errors: [`Error::Config`] for an empty/oversized key or a non-positive lease,
/// [`Error::Connection`] / [`Error::Database`] from PostgreSQL.
pub async fn claim_noting(
    conn: &Conn,
    req: &ClaimRequest,
    token: Uuid,
) -> Result<(ClaimReply, Option<Repeat>)> {
    let (decision, at) = claim_at(conn, req, token).await?;
    let repeat = Repeat::after_claim(req, &decision, at);
    Ok((decision, repeat))
}
