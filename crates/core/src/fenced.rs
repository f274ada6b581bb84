//! Completion, release and the other fenced changes: what only the current claim
//! holder may do to its record ([`Fenced`]), sent on one connection ([`fenced`],
//! [`fenced_with_result`]). Each statement's text is in [`crate::sql`].

use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::record::{self, PreparedResult};
use crate::sql;

/// A change that only the current claim holder may make. Every fenced statement
/// has the same guard: the record is still `claimed` under the caller's token.
/// Parameters: $1 job_type, $2 operation_key, $3 claim_token, then the change's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Mark the claim completed: the effect is done. `completed_at` is the time the
    /// statement runs (`clock_timestamp()`), not its transaction's start: inside a
    /// transactional claim it follows the job's own statements, so a copy that arrived
    /// meanwhile (and waited on the row lock) is seen to have arrived before it.
    ///
    /// Stored results (V7): $4 the body's result as JSON text (or NULL) and $5 its
    /// `result_state` (NULL when no store was requested; see [`PreparedResult`]) are
    /// written by the same statement. A completion with a store request also wakes the
    /// callers waiting for it (`pg_notify` on the record's channel, sent at commit:
    /// [`sql::CHANNEL_SQL`]); a plain completion notifies nobody (no extra cost).
    Complete,
    /// [`Fenced::Complete`], committed with `synchronous_commit = off` (the
    /// `asynchronous_completion` setting; never inside a transaction).
    CompleteAsynchronously,
    /// Give the claim back after the job raised ($4: error text); the next delivery
    /// (Sidekiq's retry) claims again at once.
    Release,
    /// `:hold` policy: keep the operation from running until a person resolves it.
    Hold,
    /// `:skip` policy: give the operation up (a rare miss).
    GiveUp,
    /// End the lease now, so the next delivery treats the claim as stale again (an
    /// outside lookup failed and nothing may run blindly).
    Expire,
    /// Heartbeat: renew the lease for another `lease_seconds` from now.
    Renew,
}

impl Fenced {
    /// The statement ([`crate::sql`]), fenced by the claim token.
    pub fn sql(self) -> &'static str {
        match self {
            Fenced::Complete => sql::COMPLETE_SQL,
            Fenced::CompleteAsynchronously => sql::COMPLETE_ASYNCHRONOUSLY_SQL,
            Fenced::Release => sql::RELEASE_SQL,
            Fenced::Hold => sql::HOLD_SQL,
            Fenced::GiveUp => sql::GIVE_UP_SQL,
            Fenced::Expire => sql::EXPIRE_SQL,
            Fenced::Renew => sql::RENEW_SQL,
        }
    }

    /// Every change.
    pub const ALL: [Fenced; 7] = [
        Fenced::Complete,
        Fenced::CompleteAsynchronously,
        Fenced::Release,
        Fenced::Hold,
        Fenced::GiveUp,
        Fenced::Expire,
        Fenced::Renew,
    ];

    /// The change's name, as the bindings spell it (Ruby's Symbols: `:complete`,
    /// `:complete_asynchronously`, `:release`, `:hold`, `:give_up`, `:expire`, `:renew`).
    pub fn name(self) -> &'static str {
        match self {
            Fenced::Complete => "complete",
            Fenced::CompleteAsynchronously => "complete_asynchronously",
            Fenced::GiveUp => "give_up",
            other => other.verb(),
        }
    }

    /// The change of this [`Fenced::name`], if any.
    pub fn named(name: &str) -> Option<Fenced> {
        Fenced::ALL.into_iter().find(|change| change.name() == name)
    }

    fn verb(self) -> &'static str {
        match self {
            Fenced::Complete | Fenced::CompleteAsynchronously => "complete",
            Fenced::Release => "release",
            Fenced::Hold => "hold",
            Fenced::GiveUp => "give up",
            Fenced::Expire => "expire",
            Fenced::Renew => "renew",
        }
    }
}

/// Applies a [`Fenced`] change to the claim `token`. `text` is the change's own
/// parameter ($4: the error text of [`Fenced::Release`] and [`Fenced::Expire`]). A
/// completion made here stores no result (see [`fenced_with_result`]).
///
/// Sent like the claim (see [`Conn::query_own`]).
///
/// Errors: [`Error::LostClaim`] when `token` is no longer the record's claim (the
/// lease ran out and another delivery took over, or the claim already ended);
/// connection/database errors.
pub async fn fenced(
    conn: &Conn,
    change: Fenced,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    text: Option<&str>,
) -> Result<()> {
    fenced_with_result(conn, change, job_type, operation_key, token, text, None).await
}

/// [`fenced`], with the body's result for a completion ([`Fenced::Complete`] /
/// [`Fenced::CompleteAsynchronously`]): `result` (from [`record::prepare`]) is
/// written by the completion statement itself ($4, $5), so storing it costs no extra
/// round trip; `None` stores nothing (no store requested). Ignored by other changes.
///
/// Errors: as [`fenced`].
pub async fn fenced_with_result(
    conn: &Conn,
    change: Fenced,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    text: Option<&str>,
    result: Option<&PreparedResult>,
) -> Result<()> {
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
        (&job_type, Type::TEXT),
        (&operation_key, Type::TEXT),
        (&token, Type::UUID),
    ];
    let given = text;
    let text = text.unwrap_or_default();
    if matches!(change, Fenced::Release | Fenced::Expire) {
        params.push((&text, Type::TEXT));
    }
    if change == Fenced::Hold {
        params.push((&given, Type::TEXT));
    }
    let (json, state) = record::params(result);
    if matches!(change, Fenced::Complete | Fenced::CompleteAsynchronously) {
        params.push((&json, Type::TEXT));
        params.push((&state, Type::TEXT));
    }
    let result = conn.execute_own(change.sql(), &params).await;
    match result? {
        1 => Ok(()),
        _ => Err(Error::LostClaim {
            job_type: job_type.to_string(),
            operation_key: operation_key.to_string(),
            message: format!(
                "cannot {} {job_type} operation {operation_key:?}: claim {token} is no longer \
                 held (its lease ran out and another delivery took the operation over)",
                change.verb()
            ),
        }),
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn every_change_is_found_by_its_name() {
        for change in Fenced::ALL {
            assert_eq!(Fenced::named(change.name()), Some(change));
        }
        assert_eq!(Fenced::GiveUp.name(), "give_up");
        assert_eq!(Fenced::named("give up"), None);
    }
}
