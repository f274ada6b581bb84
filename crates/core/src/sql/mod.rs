//! Every SQL statement the core sends on the record table, one text per statement,
//! shared by every path that sends it (the native pool, a transaction, the Ruby
//! binding's ActiveRecord strategy, which asks for the text). The record's read
//! (`FIND_SQL`) and the resolve (`RESOLVE_SQL`, over `resolve_update!`'s change) are
//! generated with the record's columns in the `record` module; the schema's in `migrate`.
//!
//! Parameters are numbered as each constant's doc says; every statement on one
//! operation takes $1 job_type and $2 operation_key.
//!
//! By concern: `fragments` (the texts several statements share: the repeats kept, the
//! record's channel, the reclaim budget's reason), `claim` (a delivery's statements
//! before its job runs), `fenced` (completion, release and the other fenced changes),
//! `resolve` (settling a held operation, the stored job's rule), `flush` (the repeat
//! bookkeeping's batches), `wait` (a waiter's channel and look), `reads` (the
//! operators' lists and metrics), `purge` (the retention's purge), `schema` (the live
//! columns, the migration lock). Every constant is re-exported here, so callers name
//! `sql::CLAIM_SQL` whichever file states it.

#[macro_use]
mod fragments;
#[macro_use]
mod resolve;

mod claim;
mod fenced;
mod flush;
mod purge;
mod reads;
mod schema;
mod wait;

pub use claim::{
    CLAIM_SQL, COMPLETED_SQL, DELIVER_SQL, LOCK_TIMEOUT_RESET_SQL, LOCK_TIMEOUT_SQL,
    SETTLED_LOOK_SQL,
};
pub use fenced::{
    COMPLETE_ASYNCHRONOUSLY_SQL, COMPLETE_SQL, EXPIRE_SQL, GIVE_UP_SQL, HOLD_SQL, RELEASE_SQL,
    RENEW_SQL,
};
pub use flush::{FLUSH_AWAITING_SQL, FLUSH_SQL};
pub(crate) use fragments::reclaim_budget_spent;
pub use fragments::RECLAIM_BUDGET_SPENT;
pub use purge::{PURGE_PLAN_RESET_SQL, PURGE_PLAN_SQL, PURGE_SQL};
pub use reads::{
    GIVEN_UP_SQL, HELD_SQL, JOB_TYPES_SQL, METRICS_SQL, REPEATS_SQL, SEARCH_SQL, STALE_CLAIMS_SQL,
    TAKEOVERS_SQL,
};
pub use resolve::NO_STORED_JOB_SQL;
pub use schema::{COLUMNS_SQL, MIGRATION_LOCK_SQL, MIGRATION_LOCK_TABLE_SQL, MIGRATION_UNLOCK_SQL};
pub use wait::{CHANNEL_SQL, WAIT_SQL};
