//! The idempotency record and the decision types: what a delivery asks for
//! ([`ClaimRequest`], checked by [`check_request`]), what the claim statement answers
//! ([`ClaimRow`], turned into a [`ClaimReply`] by [`decide`], the one place that reads a
//! claim's outcome), the whole stored record ([`Record`], read by `FIND_SQL`), and a
//! stored result ([`ResultState`], [`Replay`], [`PreparedResult`], checked by
//! [`prepare`]). No I/O here.
//!
//! By concern: `stored` (the `record!` list: [`Record`], [`Field`], [`FIND_SQL`],
//! [`RESOLVE_SQL`]), `claim` (the request, the claim statement's row and its reading),
//! `result` (stored results). Everything is re-exported here: callers name
//! `record::ClaimRequest` whichever file states it.

mod claim;
mod result;
mod stored;

pub use claim::{
    check_request, decide, ClaimAnswer, ClaimKind, ClaimReply, ClaimRequest, ClaimRow,
};
pub(crate) use result::params;
pub use result::{prepare, PreparedResult, Replay, ResultInput, ResultState};
pub(crate) use stored::unreadable_column;
pub use stored::{Field, Record, FIND_SQL, RESOLVE_SQL};
