//! The operating calls every binding exposes (find a record, list held operations,
//! resolve one, purge finished ones, the repeats report), each made here once so the
//! Ruby gem and the Python package behave alike: which connection lane, whether a
//! statement may be sent again on a fresh connection, and what a failing bookkeeping
//! write does to a read. The statements are [`crate::records`]'s.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::conn::{Conn, Interrupt};
use crate::error::{Error, Result};
use crate::pool::{with_conn, with_fresh_conn, Lane};
use crate::record::Record;
use crate::records::{self, PurgeBatch, PurgeCursor, Repeated, Resolution};
use crate::store::PoolHandle;

/// How many held operations [`held`] lists when the caller names no limit.
pub const DEFAULT_HELD_LIMIT: i64 = 100;
/// Records one [`purge_batch`] deletes when the caller names no batch size.
pub const DEFAULT_PURGE_BATCH: i64 = 1000;
/// How far back [`repeats`] looks when the caller names no `since`, in seconds (24 hours).
pub const DEFAULT_REPEATS_SINCE_SECONDS: f64 = 86_400.0;

/// Runs `op` on a fresh connection of the main lane after writing this process's
/// queued repeat bookkeeping, so a read sees the process's own repeats. When that
/// write fails with a retryable error (a read-only server in a failover, an outage),
/// the read goes on without them: they stay queued for the next settle.
///
/// Errors: a bookkeeping error that is not retryable; `op`'s own (as
/// [`with_fresh_conn`]).
pub fn with_settled_conn<T>(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    op: impl AsyncFn(&mut Conn) -> Result<T>,
) -> Result<T> {
    match pool.bookkeeper().settle(pool, interrupt) {
        Err(e) if !e.retryable() => return Err(e),
        _ => {}
    }
    with_fresh_conn(pool, interrupt, Lane::Main, op)
}

/// `texts` (what each is, as a caller names it: `"job type"`, `"operation key"`) checked
/// for U+0000, which PostgreSQL's text cannot store (so no record holds one): sent, one
/// would be answered SQLSTATE 22021, a `DatabaseError` naming nothing.
///
/// Errors: [`Error::Config`] naming the first such text (escaped) and what it is.
fn check_texts(texts: &[(&str, Option<&str>)]) -> Result<()> {
    match texts
        .iter()
        .find_map(|(what, text)| text.filter(|t| t.contains('\0')).map(|t| (what, t)))
    {
        Some((what, text)) => Err(Error::Config(format!(
            "the {what} {:?} holds a NUL character (U+0000), which PostgreSQL's text cannot \
             store: no record has one",
            text.chars().take(200).collect::<String>()
        ))),
        None => Ok(()),
    }
}

/// The record of `(job_type, operation_key)`, or `None` when never claimed; settled
/// first ([`with_settled_conn`]).
///
/// Errors: [`Error::Config`] for a job type or key holding U+0000; connection and
/// database errors.
pub fn find(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    job_type: &str,
    operation_key: &str,
) -> Result<Option<Record>> {
    check_texts(&[
        ("job type", Some(job_type)),
        ("operation key", Some(operation_key)),
    ])?;
    with_settled_conn(pool, interrupt, async |c| {
        records::find(c, job_type, operation_key).await
    })
}

/// One record for a list ([`records::find_listed`]): [`find`], but a record the core
/// cannot read is [`records::Listed::Unreadable`] (its column named), not an error.
///
/// Errors: [`Error::Config`] for a job type or key that is not valid text; connection
/// and database errors.
pub fn find_listed(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    job_type: &str,
    operation_key: &str,
) -> Result<Option<records::Listed>> {
    check_texts(&[
        ("job type", Some(job_type)),
        ("operation key", Some(operation_key)),
    ])?;
    with_settled_conn(pool, interrupt, async |c| {
        records::find_listed(c, job_type, operation_key).await
    })
}

/// Up to `limit` held operations (of `job_type`, or of every type), oldest first, as
/// `(job_type, operation_key)` pairs. Read-only: sent again on a fresh connection.
///
/// Errors: [`Error::Config`] for a limit below 1 (before anything is sent);
/// connection and database errors.
pub fn held(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    job_type: Option<&str>,
    limit: i64,
) -> Result<Vec<(String, String)>> {
    check_texts(&[("job type", job_type)])?;
    check_held_limit(limit)?;
    with_fresh_conn(pool, interrupt, Lane::Main, async |c| {
        records::held(c, job_type, limit).await
    })
}

/// Checks [`held`]'s `limit`: 1 or more (an `i64`).
///
/// Errors: [`held_limit_refused`] stating the valid range and what was given.
pub fn check_held_limit(limit: i64) -> Result<()> {
    if limit < 1 {
        return Err(held_limit_refused(&limit.to_string()));
    }
    Ok(())
}

/// The refusal of [`held`]'s limit `shown` (as the binding shows the value it was given):
/// below 1, or not a whole number at all (a binding refuses `1.5`, `"5"` or `true` with
/// it before calling [`held`], rather than taking them as a whole number).
pub fn held_limit_refused(shown: &str) -> Error {
    Error::Config(format!(
        "held needs a limit of at least 1 (up to {}), got {shown}",
        i64::MAX
    ))
}

impl Resolution {
    /// The resolutions' names, in the order messages list them.
    pub const NAMES: [&'static str; 2] = ["done", "rerun"];

    /// The resolution named `name`: `done` or `rerun`. Both bindings parse `resolve`'s
    /// `as` here (Ruby's `IdempotentJob.resolve(as:)`, a Symbol's or String's name;
    /// Python's `resolve(as_=)`), so its rule and words are stated once.
    ///
    /// Errors: [`Resolution::refused`] with `name` shown as JSON text.
    pub fn parse(name: &str) -> Result<Resolution> {
        match name {
            "done" => Ok(Resolution::Done),
            "rerun" => Ok(Resolution::Rerun),
            other => Err(Resolution::refused(
                &Value::String(other.into()).to_string(),
            )),
        }
    }

    /// The refusal of a value `resolve`'s `as` does not take, `shown` in the host's
    /// notation (a value that is not text: Ruby's `inspect`, Python's `repr`):
    /// [`Error::Config`] "resolve as must be done or rerun, got …".
    pub fn refused(shown: &str) -> Error {
        let [done, rerun] = Resolution::NAMES;
        Error::Config(format!("resolve as must be {done} or {rerun}, got {shown}"))
    }
}

/// Settles a held or given-up operation as `resolution`, answering its record after the
/// change and the stored delivery of its last claim ([`records::Resolved`]), or `None`
/// when it is neither held nor given up (never claimed, or settled already): the one
/// statement decides, so nothing can change the record between a check and the change.
/// Sent once: a repeat after a lost answer would find it settled and answer `None`.
///
/// Errors: [`crate::error::Error::Config`] for a rerun of a record without a stored job
/// (see [`records::resolve_stored`]); connection and database errors.
pub fn resolve(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    job_type: &str,
    operation_key: &str,
    resolution: Resolution,
) -> Result<Option<records::Resolved>> {
    check_texts(&[
        ("job type", Some(job_type)),
        ("operation key", Some(operation_key)),
    ])?;
    with_conn(pool, interrupt, async |c| {
        records::resolve_record(c, job_type, operation_key, resolution).await
    })
}

/// [`resolve`], answering only the stored delivery of the operation's last claim (what
/// a rerun re-sends: [`records::StoredDelivery`]), or `None` when the operation is not
/// held or given up. Sent once, as [`resolve`].
///
/// Errors: [`crate::error::Error::Config`] for a rerun of a record without a stored job
/// (see [`records::resolve_stored`]); connection and database errors.
pub fn resolve_stored(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    job_type: &str,
    operation_key: &str,
    resolution: Resolution,
) -> Result<Option<records::StoredDelivery>> {
    check_texts(&[
        ("job type", Some(job_type)),
        ("operation key", Some(operation_key)),
    ])?;
    with_conn(pool, interrupt, async |c| {
        records::resolve_stored(c, job_type, operation_key, resolution).await
    })
}

/// One purge batch of finished records older than `older_than` seconds, after
/// `after` (see [`records::purge_batch`]; a purge is over when a batch picks fewer
/// than `batch`). Safe to send again: a fresh connection after a lost one.
///
/// Errors: [`Error::Config`] for a bad age or batch; connection and database errors.
pub fn purge_batch(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    older_than: f64,
    batch: i64,
    after: &PurgeCursor,
) -> Result<PurgeBatch> {
    with_fresh_conn(pool, interrupt, Lane::Main, async |c| {
        records::purge_batch(c, older_than, batch, after).await
    })
}

/// PostgreSQL's first `timestamptz` (4714-11-24 00:00:00 UTC BC), in epoch seconds
/// (defined with the purge that also needs it, [`records::POSTGRES_FIRST_SECOND`]).
pub use crate::records::POSTGRES_FIRST_SECOND;

/// `since` as a bound PostgreSQL takes: a time before [`POSTGRES_FIRST_SECOND`] (every
/// record is after it) is that first second, so it still asks for everything.
pub fn since_bound(since: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(POSTGRES_FIRST_SECOND, 0).map_or(since, |first| since.max(first))
}

/// The operations repeated since `since` (of `job_type`, or of every type), settled
/// first ([`with_settled_conn`]). A `since` before PostgreSQL's first timestamp asks for
/// every repeat ([`since_bound`]).
///
/// Errors: connection and database errors.
pub fn repeats(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    since: DateTime<Utc>,
    job_type: Option<&str>,
) -> Result<Vec<Repeated>> {
    check_texts(&[("job type", job_type)])?;
    let since = since_bound(since);
    with_settled_conn(pool, interrupt, async |c| {
        records::repeats(c, since, job_type).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolution_is_parsed_by_name_and_anything_else_refused_in_one_wording() {
        assert_eq!(Resolution::parse("done").unwrap(), Resolution::Done);
        assert_eq!(Resolution::parse("rerun").unwrap(), Resolution::Rerun);
        assert_eq!(
            Resolution::parse("maybe").unwrap_err().to_string(),
            r#"resolve as must be done or rerun, got "maybe""#
        );
        assert!(matches!(Resolution::parse("Done"), Err(Error::Config(_))));
        assert_eq!(
            Resolution::refused("1").to_string(),
            "resolve as must be done or rerun, got 1"
        );
    }
}
