//! The options a job declares (the operation key, its lease, its stale policy…): each
//! option's name, kind, allowed values, limits and default, stated once here for every
//! binding and door. A door spells the names its own way (the Sidekiq door prefixes
//! them `idempotency_`, ActiveJob's `idempotency` and the plain API take them bare,
//! Celery's task options are prefixed too); it hands that prefix in, so messages name
//! the option as the user wrote it.
//!
//! Bindings read the table ([`JOB_OPTIONS`], or [`table_json`] as JSON) instead of
//! restating it, check each value with [`check`] and refuse an unknown name with
//! [`unknown`] (which suggests the nearest known name). Options whose value only the
//! host language can judge — the operation key declaration (it names parameters of
//! the job's method) and the lookup (a method or a callable) — are of kinds
//! [`Kind::Key`] and [`Kind::Method`]: [`check`] passes them through unchanged.
//!
//! To add an option: add one [`JobOption`] to [`JOB_OPTIONS`] (and, for a new kind of
//! value, a [`Kind`]); the bindings pick it up from the table.
//!
//! By concern: `table` (the table itself, [`find`]), `json` ([`table_json`]), `check`
//! ([`check`]), `names` (unknown names: [`unknown`], [`nearest`], their kin). Every
//! item is re-exported here: callers name `options::check` whichever file states it.

mod check;
mod json;
mod names;
mod table;

pub use check::{check, check_kind};
pub(crate) use json::default_json;
pub use json::table_json;
pub use names::{nearest, not_taken, suggestion, unknown, unknown_among, unknown_setting};
pub use table::{
    find, Default, JobOption, Kind, DURATION, ENQUEUE_POLICIES, JOB_OPTIONS, MAX_LEASE_SECONDS,
    MAX_PG_TIMEOUT_SECONDS, MAX_SECONDS, MAX_TAKEOVERS, MIN_LEASE_SECONDS, MISMATCH_POLICIES,
    PG_TIMEOUT, STALE_POLICIES, TRANSACTIONS,
};

#[cfg(test)]
mod tests;
