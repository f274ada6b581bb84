//! The SQL fragments several statements share, written once: how many repeats a
//! record keeps (`repeats_kept!`), the record's LISTEN/NOTIFY channel
//! (`notify_channel!`) and the reason a hold by the reclaim budget stores
//! (`reclaim_budget_spent!`, [`RECLAIM_BUDGET_SPENT`]).

/// How many repeats a record keeps the latest of (`repeat_times`, `repeat_facts`), as
/// the statements spell it; `config::REPEATS_KEPT` is the same number for Rust.
macro_rules! repeats_kept {
    () => {
        "20"
    };
}

/// The LISTEN/NOTIFY channel of one record, as an SQL expression over its `job_type`
/// and `operation_key` columns: `idempotent_job_` and the md5 of the length-prefixed
/// pair (a valid identifier of 47 characters, whatever the key). Written once here;
/// the completion and release notify on it, a waiter listens on it (`CHANNEL_SQL`).
macro_rules! notify_channel {
    () => {
        "'idempotent_job_' || md5(length(job_type) || ':' || job_type || operation_key)"
    };
}

/// How the reason a hold by the reclaim budget (`max_takeovers`) stores in `last_error`
/// begins: written once here, for the protocol's text
/// (the protocol's `reclaim_budget_reason`) and `METRICS_SQL`'s count of such holds.
macro_rules! reclaim_budget_spent {
    () => {
        "the reclaim budget is spent"
    };
}
pub(crate) use reclaim_budget_spent;

/// How the reason a hold by the reclaim budget stores in `last_error` begins (the
/// record of a body that kept killing its worker).
pub const RECLAIM_BUDGET_SPENT: &str = reclaim_budget_spent!();
