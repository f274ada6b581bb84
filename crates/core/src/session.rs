//! Transactional sessions for same-database effects (`idempotency_transaction: true`):
//! the claim, the job's own statements and the completion run in ONE transaction on
//! one pooled connection, and commit together or not at all.
//!
//! Statement order, all at READ COMMITTED:
//! 1. `BEGIN ISOLATION LEVEL READ COMMITTED`
//! 2. `SET LOCAL lock_timeout` to the job's bound, the claim ([`CLAIM_SQL`]), then
//!    `lock_timeout` back to the session's default. A concurrent delivery of the same
//!    operation blocks inside step 2 on the unique index until this transaction ends,
//!    then sees the truth: the record completed (it skips) or no record at all (this
//!    transaction rolled back: it claims and runs).
//! 3. the job's statements ([`Session::query`], [`Session::execute`]);
//! 4. the completion ([`Fenced::Complete`]), then `COMMIT`.
//!
//! A repeat met by the claim (a duplicate that waited for another delivery's commit, a
//! retry, a takeover) is counted by the claim statement inside the transaction; its
//! delivery facts (`repeat_facts`) are queued for the asynchronous bookkeeping
//! ([`crate::bookkeeping`]) once the transaction commits, so the background writer
//! never waits on this transaction's row lock, and a rolled-back transaction leaves no
//! trace of its claim, as the record itself does not.
//!
//! A connection whose session did not end with commit or rollback (an interrupt, a
//! crash of the caller) is never returned to the pool: it is closed, and PostgreSQL
//! rolls the transaction back.
//!
//! [`CLAIM_SQL`]: crate::sql::CLAIM_SQL

use tokio_postgres::types::{ToSql, Type};

use crate::bookkeeping::{Bookkeeper, Repeat};
use crate::claim;
use crate::config::MAX_PG_TIMEOUT_SECONDS;
use crate::conn::Interrupt;
use crate::error::{Error, Result};
use crate::fenced::{self, Fenced};
use crate::pool::{checkout_live, Lane, Pooled};
use crate::record::{self, ClaimReply, ClaimRequest, PreparedResult};
use crate::sql;
use crate::store::PoolHandle;
use crate::values::{self, Param, Rows};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The value [`sql::LOCK_TIMEOUT_SQL`] takes for a lock timeout of `seconds`: whole
/// milliseconds, rounded up (`"1500ms"`). For every transactional claim, the native
/// [`Session`]'s and a binding's own connection's (Ruby's ActiveRecord strategy).
pub fn lock_timeout_param(seconds: f64) -> String {
    format!("{}ms", (seconds * 1000.0).ceil() as u64)
}

/// The error of a transactional claim that waited more than `seconds` for another
/// delivery's open transaction on the same record: [`Error::LockTimeout`] naming the
/// job type, the operation key and the wait, then PostgreSQL's `message`.
pub fn lock_timeout_error(
    job_type: &str,
    operation_key: &str,
    seconds: f64,
    message: &str,
) -> Error {
    Error::LockTimeout {
        message: format!(
            "{job_type} operation {operation_key:?}: another delivery kept it locked for more than \
             {seconds} s (its transaction is still open): {message}"
        ),
    }
}

/// One open transaction on a pooled connection.
pub struct Session {
    conn: Pooled,
    books: Arc<Bookkeeper>,
    /// The claim's repeat bookkeeping, queued at commit.
    repeat: Option<Repeat>,
}

fn params(values: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// The error of a job statement's parameters or result columns: a conversion failure
/// (which placeholder or column, which cast) is an [`Error::Config`] naming the
/// statement; anything else converts as usual.
fn bind_error(sql: &str, err: tokio_postgres::Error) -> Error {
    // Conversion failures carry our own message (which placeholder, which cast).
    if err.as_db_error().is_none() && !err.is_closed() {
        if let Some(source) = std::error::Error::source(&err) {
            return Error::Config(format!("{source} (in: {})", sql.trim()));
        }
    }
    err.into()
}

impl Session {
    /// Checks a connection out of `pool` and begins a READ COMMITTED transaction.
    ///
    /// The gem's own statements of a session (BEGIN, the claim, the completion,
    /// COMMIT, ROLLBACK) are each bounded by the deadline (the claim by the deadline
    /// plus its lock timeout) and never repeated: a transaction cannot move to a fresh
    /// connection. The job's own statements ([`Session::query`], [`Session::execute`])
    /// are bounded by `statement_timeout` and, on a dead network, by the connection's
    /// `TCP_USER_TIMEOUT`, not by the deadline.
    pub fn begin(pool: &PoolHandle, interrupt: &Interrupt<'_>) -> Result<Session> {
        let until = Instant::now() + pool.deadline();
        let mut conn = checkout_live(pool, interrupt, Lane::Main, until)?;
        conn.run_until(interrupt, Some(until), async |c| {
            // The job's own statements are planned as PostgreSQL would by default
            // (the connection forces generic plans for the gem's statements only).
            let begin = if c.prepared_statements() {
                "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL plan_cache_mode = auto"
            } else {
                "BEGIN ISOLATION LEVEL READ COMMITTED"
            };
            Ok(c.batch_execute(begin).await?)
        })?;
        Ok(Session {
            conn,
            books: pool.bookkeeper().clone(),
            repeat: None,
        })
    }

    /// Claims inside the transaction, waiting at most `lock_timeout_seconds` for
    /// another transaction that holds the operation's row.
    ///
    /// Errors: [`Error::LockTimeout`] when the wait runs out; see [`claim::claim_noting`]
    /// (connection, database and timeout errors name the job and the operation:
    /// [`Error::naming_claim`]).
    pub fn claim(
        &mut self,
        interrupt: &Interrupt<'_>,
        req: &ClaimRequest,
        lock_timeout_seconds: f64,
    ) -> Result<ClaimReply> {
        record::check_request(req)?;
        if !(lock_timeout_seconds > 0.0 && lock_timeout_seconds <= MAX_PG_TIMEOUT_SECONDS) {
            return Err(Error::Config(format!(
                "the lock timeout of {} must be a positive number of seconds up to \
                 {MAX_PG_TIMEOUT_SECONDS}",
                req.job_type
            )));
        }
        let millis = lock_timeout_param(lock_timeout_seconds);
        let until = self.until() + Duration::from_secs_f64(lock_timeout_seconds);
        let claimed = self.conn.run_until(interrupt, Some(until), async |c| {
            c.execute_typed(sql::LOCK_TIMEOUT_SQL, &[(&millis, Type::TEXT)])
                .await?;
            let noted = claim::claim_noting(c, req, uuid::Uuid::new_v4()).await;
            let (decision, repeat) = noted.map_err(|e| match e {
                Error::LockTimeout { message } => lock_timeout_error(
                    &req.job_type,
                    &req.operation_key,
                    lock_timeout_seconds,
                    &message,
                ),
                other => other,
            })?;
            c.batch_execute(sql::LOCK_TIMEOUT_RESET_SQL).await?;
            Ok((decision, repeat))
        });
        let (decision, repeat) =
            claimed.map_err(|e| e.naming_claim(&req.job_type, &req.operation_key))?;
        self.repeat = repeat;
        Ok(decision)
    }

    /// Applies a fenced change (the completion) inside the transaction.
    pub fn fenced(
        &mut self,
        interrupt: &Interrupt<'_>,
        change: Fenced,
        job_type: &str,
        operation_key: &str,
        token: uuid::Uuid,
        text: Option<&str>,
    ) -> Result<()> {
        self.fenced_with_result(
            interrupt,
            change,
            job_type,
            operation_key,
            token,
            text,
            None,
        )
    }

    /// [`Session::fenced`], with the completion's stored result (see
    /// [`fenced::fenced_with_result`]; None: no store requested).
    #[allow(clippy::too_many_arguments)]
    pub fn fenced_with_result(
        &mut self,
        interrupt: &Interrupt<'_>,
        change: Fenced,
        job_type: &str,
        operation_key: &str,
        token: uuid::Uuid,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        let until = self.until();
        self.conn.run_until(interrupt, Some(until), async |c| {
            fenced::fenced_with_result(c, change, job_type, operation_key, token, text, result)
                .await
        })
    }

    /// Runs one of the job's statements and returns its rows. Placeholders are `$1`,
    /// `$2`…; each parameter is converted to the type PostgreSQL infers for it.
    pub fn query(
        &mut self,
        interrupt: &Interrupt<'_>,
        sql: &str,
        values: &[Param],
    ) -> Result<Rows> {
        self.conn.run(interrupt, async |c| {
            let statement = c.prepare(sql).await?;
            let result = c
                .query(&statement, &params(values))
                .await
                .map_err(|e| bind_error(sql, e))?;
            // A column of a type the gem does not convert is the statement's problem,
            // not the connection's (which stays usable): said as such, never retried.
            values::rows(result).map_err(|e| bind_error(sql, e))
        })
    }

    /// Runs one of the job's statements and returns the number of rows it affected.
    pub fn execute(
        &mut self,
        interrupt: &Interrupt<'_>,
        sql: &str,
        values: &[Param],
    ) -> Result<u64> {
        self.conn.run(interrupt, async |c| {
            let statement = c.prepare(sql).await?;
            c.execute(&statement, &params(values))
                .await
                .map_err(|e| bind_error(sql, e))
        })
    }

    /// The deadline of a gem statement sent now.
    fn until(&self) -> Instant {
        Instant::now() + self.conn.deadline()
    }

    /// Commits, and returns the connection to the pool; then queues the claim's repeat
    /// bookkeeping, if any.
    pub fn commit(mut self, interrupt: &Interrupt<'_>) -> Result<()> {
        let (books, repeat) = (self.books.clone(), self.repeat.take());
        self.end(interrupt, "COMMIT")?;
        if let Some(repeat) = repeat {
            books.record(repeat);
        }
        Ok(())
    }

    /// Rolls back, and returns the connection to the pool.
    pub fn rollback(self, interrupt: &Interrupt<'_>) -> Result<()> {
        self.end(interrupt, "ROLLBACK")
    }

    fn end(mut self, interrupt: &Interrupt<'_>, sql: &'static str) -> Result<()> {
        let until = self.until();
        self.conn.run_until(interrupt, Some(until), async |c| {
            Ok(c.batch_execute(sql).await?)
        })?;
        self.conn.finish();
        Ok(())
    }
}
