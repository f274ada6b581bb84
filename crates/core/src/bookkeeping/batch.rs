//! One batch as the statement's parameters, and what the statement left out of it
//! (rows another transaction held, entries whose transaction is not known committed).

use std::collections::BTreeMap;

use serde_json::Value;

use super::pending::{Key, Queue};

/// What [`FLUSH_SQL`](crate::sql::FLUSH_SQL) left out of a batch.
#[derive(Default)]
pub(super) struct LeftOut {
    /// The operations whose row another transaction held.
    pub(super) locked: Vec<Key>,
    /// Per operation, the positions (from 1) in its `awaiting` of the entries whose
    /// transaction is still in progress, and of those PostgreSQL could not answer for
    /// (those of a transaction that rolled back are not listed).
    pub(super) awaiting: BTreeMap<Key, (Vec<usize>, Vec<usize>)>,
}

/// [`FLUSH_SQL`](crate::sql::FLUSH_SQL)'s rows `(job_type, operation_key)`, or [`FLUSH_AWAITING_SQL`](crate::sql::FLUSH_AWAITING_SQL)'s
/// `(job_type, operation_key, awaiting, status)`.
pub(super) fn left_out(rows: &[tokio_postgres::Row]) -> LeftOut {
    let mut left = LeftOut::default();
    for row in rows {
        let (Ok(job_type), Ok(operation_key)) = (row.try_get(0), row.try_get(1)) else {
            continue;
        };
        let key = (job_type, operation_key);
        match row.try_get::<_, Option<i64>>(2).ok().flatten() {
            None => left.locked.push(key),
            Some(n) => {
                let (waiting, unknown) = left.awaiting.entry(key).or_default();
                let n = usize::try_from(n).unwrap_or(0);
                match row.try_get::<_, Option<&str>>(3).ok().flatten() {
                    Some("in progress") => waiting.push(n),
                    Some("aborted") => {}
                    _ => unknown.push(n),
                }
            }
        }
    }
    left
}

/// The batch as [`FLUSH_SQL`](crate::sql::FLUSH_SQL)'s $1, $2, $3: one entry per operation, in the order of
/// `(job_type, operation_key)`.
pub(super) fn batch_params(batch: &Queue) -> (Vec<String>, Vec<String>, Vec<Value>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for ((job_type, operation_key), pending) in batch {
        out.0.push(job_type.clone());
        out.1.push(operation_key.clone());
        out.2.push(pending.doc());
    }
    out
}
