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
//! A connection whose session did not end with commit or rollback (an interrupt, a
//! crash of the caller) is never returned to the pool: it is closed, and PostgreSQL
//! rolls the transaction back.
//!
//! [`CLAIM_SQL`]: super::claim::CLAIM_SQL

use tokio_postgres::types::{ToSql, Type};

use super::claim::{self, ClaimRequest, Decision, Fenced};
use super::config::MAX_PG_TIMEOUT_SECONDS;
use super::error::{Error, Result};
use super::store::{bounded, checkout_bounded, Conn, Pool};
use super::values::{self, Param, Rows};
use std::time::Instant;

/// One open transaction on a pooled connection.
pub struct Session {
    conn: Conn,
}

fn params(values: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

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
    /// COMMIT, ROLLBACK) are each bounded by the deadline ([`Conn::deadline`]; the claim
    /// by the deadline plus its lock timeout) and never repeated: a transaction cannot
    /// move to a fresh connection. The job's own statements ([`Session::query`],
    /// [`Session::execute`]) are bounded by `statement_timeout` and, on a dead network,
    /// by the connection's `TCP_USER_TIMEOUT`.
    pub async fn begin(pool: &Pool) -> Result<Session> {
        let conn = checkout_bounded(pool).await?;
        let begin = async {
            Ok(conn
                .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .await?)
        };
        bounded(conn.deadline(), Instant::now(), begin).await?;
        Ok(Session { conn })
    }

    /// Claims inside the transaction, waiting at most `lock_timeout_seconds` for
    /// another transaction that holds the operation's row.
    ///
    /// Errors: [`Error::LockTimeout`] when the wait runs out; see [`claim::claim`].
    pub async fn claim(&self, req: &ClaimRequest, lock_timeout_seconds: f64) -> Result<Decision> {
        // The wait for the row is the lock timeout's to bound; the deadline adds to it.
        let bound = self.conn.deadline()
            + std::time::Duration::from_secs_f64(
                lock_timeout_seconds.clamp(0.0, MAX_PG_TIMEOUT_SECONDS),
            );
        bounded(
            bound,
            Instant::now(),
            self.claim_unbounded(req, lock_timeout_seconds),
        )
        .await
    }

    async fn claim_unbounded(
        &self,
        req: &ClaimRequest,
        lock_timeout_seconds: f64,
    ) -> Result<Decision> {
        claim::check_request(req)?;
        if !(lock_timeout_seconds > 0.0 && lock_timeout_seconds <= MAX_PG_TIMEOUT_SECONDS) {
            return Err(Error::Config(format!(
                "the lock timeout of {} must be a positive number of seconds up to \
                 {MAX_PG_TIMEOUT_SECONDS}",
                req.job_type
            )));
        }
        let millis = format!("{}ms", (lock_timeout_seconds * 1000.0).ceil() as u64);
        self.conn
            .execute_typed(
                "SELECT set_config('lock_timeout', $1, true)",
                &[(&millis, Type::TEXT)],
            )
            .await?;
        let decision = claim::claim(&self.conn, req).await.map_err(|e| match e {
            Error::LockTimeout { message } => Error::LockTimeout {
                message: format!(
                    "{} operation {:?}: another delivery kept it locked for more than {} s \
                     (its transaction is still open): {message}",
                    req.job_type, req.operation_key, lock_timeout_seconds
                ),
            },
            other => other,
        })?;
        self.conn
            .batch_execute("SET LOCAL lock_timeout TO DEFAULT")
            .await?;
        Ok(decision)
    }

    /// Applies a fenced change (the completion) inside the transaction.
    pub async fn fenced(
        &self,
        change: Fenced,
        job_type: &str,
        operation_key: &str,
        token: uuid::Uuid,
        text: Option<&str>,
    ) -> Result<()> {
        let change = claim::fenced(&self.conn, change, job_type, operation_key, token, text);
        bounded(self.conn.deadline(), Instant::now(), change).await
    }

    /// Runs one of the job's statements and returns its rows. Placeholders are `$1`,
    /// `$2`…; each parameter is converted to the type PostgreSQL infers for it.
    pub async fn query(&self, sql: &str, values: &[Param]) -> Result<Rows> {
        let statement = self.conn.prepare(sql).await?;
        let result = self
            .conn
            .query(&statement, &params(values))
            .await
            .map_err(|e| bind_error(sql, e))?;
        Ok(values::rows(result)?)
    }

    /// Runs one of the job's statements and returns the number of rows it affected.
    pub async fn execute(&self, sql: &str, values: &[Param]) -> Result<u64> {
        let statement = self.conn.prepare(sql).await?;
        self.conn
            .execute(&statement, &params(values))
            .await
            .map_err(|e| bind_error(sql, e))
    }

    /// Commits, and returns the connection to the pool.
    pub async fn commit(mut self) -> Result<()> {
        let end = async { Ok(self.conn.batch_execute("COMMIT").await?) };
        bounded(self.conn.deadline(), Instant::now(), end).await?;
        self.conn.finish();
        Ok(())
    }

    /// Rolls back, and returns the connection to the pool.
    pub async fn rollback(mut self) -> Result<()> {
        let end = async { Ok(self.conn.batch_execute("ROLLBACK").await?) };
        bounded(self.conn.deadline(), Instant::now(), end).await?;
        self.conn.finish();
        Ok(())
    }
}
