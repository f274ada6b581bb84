//! Where the protocol's statements go: [`Direct`] (the pool) or a native transaction
//! ([`Session`]). A binding whose transactions run on its own driver (Ruby's
//! ActiveRecord) implements [`Channel`] over that driver.

use std::time::Duration;

use crate::claim;
use crate::conn::Interrupt;
use crate::error::Result;
use crate::fenced::{self, Fenced};
use crate::pool::{with_fresh_conn, Lane};
use crate::record::{ClaimReply, ClaimRequest, PreparedResult};
use crate::session::Session;
use crate::store::PoolHandle;

use super::ClaimInfo;

/// The statements of one delivery's protocol.
pub trait Channel {
    /// Sends the claim statement for `request` and returns its decision.
    /// `lock_timeout_seconds` bounds a transactional claim's wait for another
    /// delivery's transaction (unused outside a transaction).
    ///
    /// Errors: [`crate::error::Error::Config`] for a bad request; connection, database,
    /// timeout, lock-timeout errors; [`crate::error::Error::Interrupted`].
    fn claim(
        &mut self,
        interrupt: &Interrupt<'_>,
        request: &ClaimRequest,
        lock_timeout_seconds: f64,
    ) -> Result<ClaimReply>;

    /// Applies a fenced change to `claim` (`text`: the error text of
    /// [`Fenced::Release`] / [`Fenced::Expire`]), with the body's prepared result when
    /// the change is a completion (`None`: no store requested), in one statement. The
    /// one method every channel implements for the fenced changes.
    ///
    /// Errors: [`crate::error::Error::LostClaim`] when the claim is no longer held;
    /// connection, database, timeout errors; [`crate::error::Error::Interrupted`].
    fn fenced_with_result(
        &mut self,
        interrupt: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()>;

    /// [`Channel::fenced_with_result`] storing no result.
    ///
    /// Errors: as [`Channel::fenced_with_result`].
    fn fenced(
        &mut self,
        interrupt: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
    ) -> Result<()> {
        self.fenced_with_result(interrupt, change, claim, text, None)
    }

    /// Records the completion of `claim` ([`Fenced::Complete`]) with the body's
    /// prepared result (`None`: no store requested), in one statement.
    ///
    /// Errors: as [`Channel::fenced_with_result`].
    fn complete(
        &mut self,
        interrupt: &Interrupt<'_>,
        claim: &ClaimInfo,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        self.fenced_with_result(interrupt, Fenced::Complete, claim, None, result)
    }

    /// Whether [`Channel::wait`] waits (false: a transaction, whose claim already
    /// waited on the row lock).
    fn can_wait(&self) -> bool {
        false
    }

    /// Waits at most `seconds` for the live claim on `request`'s operation to end,
    /// then sends the claim statement again and returns its decision; `None` when
    /// this channel cannot wait (a transaction: its claim already waited on the row
    /// lock), and the first decision stands.
    ///
    /// Errors: as [`Channel::claim`].
    fn wait(
        &mut self,
        _interrupt: &Interrupt<'_>,
        _request: &ClaimRequest,
        _seconds: f64,
    ) -> Result<Option<ClaimReply>> {
        Ok(None)
    }

    /// Whether claim, body and completion share one transaction: then no heartbeat,
    /// no release unless [`Channel::rolled_back_on_raise`] says the transaction may
    /// outlive the body's error (else the rollback undoes the claim), and the completion
    /// is written once.
    /// Every channel says so itself (no default: a pool channel that forgot would lose
    /// its heartbeat and release); a channel over a pool also overrides
    /// [`Channel::heartbeat_pool`] and [`Channel::pause`] (as [`Direct`] does), whose
    /// defaults are a transaction's.
    fn transactional(&self) -> bool;

    /// Whether a body that raised leaves no claim to release: its transaction is rolled
    /// back with the claim. The default is [`Channel::transactional`]; a channel that
    /// joined a transaction its caller opened answers false (that transaction may still
    /// commit, the caller having rescued the error), and the release is then written in
    /// it, undone with the claim if it rolls back.
    fn rolled_back_on_raise(&self) -> bool {
        self.transactional()
    }

    /// The pool a claim's heartbeat renews through (`None`, the default: in a
    /// transaction, which has no heartbeat).
    fn heartbeat_pool(&self) -> Option<&PoolHandle> {
        None
    }

    /// Waits `pause` between two attempts of the completion, watching `interrupt`.
    /// The default (a transaction's) sleeps: never reached there, a transactional
    /// completion being written once.
    ///
    /// Errors: [`crate::error::Error::Interrupted`].
    fn pause(&mut self, _interrupt: &Interrupt<'_>, pause: Duration) -> Result<()> {
        std::thread::sleep(pause);
        Ok(())
    }
}

/// Each statement on a pooled connection of its own, sent again on a fresh
/// connection when its connection dies under it (every statement of the protocol is
/// safe to send twice: see [`crate::pool`]). Fenced changes may use the reserve
/// connection ([`Lane::Reserve`]).
#[derive(Clone)]
pub struct Direct {
    pool: PoolHandle,
    asynchronous_completion: bool,
}

impl Direct {
    /// The channel of `pool`; `asynchronous_completion` (the setting) commits
    /// completions with `synchronous_commit = off` ([`Fenced::CompleteAsynchronously`]).
    pub fn new(pool: PoolHandle, asynchronous_completion: bool) -> Direct {
        Direct {
            pool,
            asynchronous_completion,
        }
    }
}

impl Channel for Direct {
    fn claim(
        &mut self,
        interrupt: &Interrupt<'_>,
        request: &ClaimRequest,
        _lock_timeout_seconds: f64,
    ) -> Result<ClaimReply> {
        claim::deliver(&self.pool, interrupt, request)
    }

    /// A completion commits asynchronously with the `asynchronous_completion`
    /// setting ([`Fenced::CompleteAsynchronously`]).
    fn fenced_with_result(
        &mut self,
        interrupt: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        let change = match change {
            Fenced::Complete if self.asynchronous_completion => Fenced::CompleteAsynchronously,
            other => other,
        };
        with_fresh_conn(&self.pool, interrupt, Lane::Reserve, async |c| {
            fenced::fenced_with_result(
                c,
                change,
                &claim.job_type,
                &claim.operation_key,
                claim.token,
                text,
                result,
            )
            .await
        })
    }

    fn can_wait(&self) -> bool {
        true
    }

    /// Waits through [`crate::results::wait`] (LISTEN/NOTIFY, or polling behind a
    /// transaction-mode PgBouncer; no pooled connection held while waiting).
    fn wait(
        &mut self,
        interrupt: &Interrupt<'_>,
        request: &ClaimRequest,
        seconds: f64,
    ) -> Result<Option<ClaimReply>> {
        crate::results::wait(&self.pool, interrupt, request, seconds).map(|w| Some(w.decision))
    }

    fn transactional(&self) -> bool {
        false
    }

    fn heartbeat_pool(&self) -> Option<&PoolHandle> {
        Some(&self.pool)
    }

    fn pause(&mut self, interrupt: &Interrupt<'_>, pause: Duration) -> Result<()> {
        self.pool.pause(interrupt, pause)
    }
}

/// A [`Direct`] channel whose pool the binding may replace while the body runs (a
/// store configured anew meanwhile takes the statements after it: the completion, the
/// release): a replacement put in `next` is taken at the next statement.
pub struct Replaceable<'a> {
    direct: Direct,
    next: &'a std::sync::Mutex<Option<Direct>>,
}

impl<'a> Replaceable<'a> {
    /// `direct`, replaced by what the binding puts in `next`.
    pub fn new(direct: Direct, next: &'a std::sync::Mutex<Option<Direct>>) -> Self {
        Replaceable { direct, next }
    }

    fn current(&mut self) -> &mut Direct {
        if let Some(next) = self.next.lock().unwrap_or_else(|p| p.into_inner()).take() {
            self.direct = next;
        }
        &mut self.direct
    }
}

impl Channel for Replaceable<'_> {
    fn claim(&mut self, i: &Interrupt<'_>, r: &ClaimRequest, lock: f64) -> Result<ClaimReply> {
        self.current().claim(i, r, lock)
    }

    fn fenced_with_result(
        &mut self,
        i: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        (self.current()).fenced_with_result(i, change, claim, text, result)
    }

    fn can_wait(&self) -> bool {
        self.direct.can_wait()
    }

    fn wait(&mut self, i: &Interrupt<'_>, r: &ClaimRequest, s: f64) -> Result<Option<ClaimReply>> {
        self.current().wait(i, r, s)
    }

    fn transactional(&self) -> bool {
        false
    }

    fn heartbeat_pool(&self) -> Option<&PoolHandle> {
        self.direct.heartbeat_pool()
    }

    fn pause(&mut self, i: &Interrupt<'_>, pause: Duration) -> Result<()> {
        self.current().pause(i, pause)
    }
}

/// A native transaction ([`Session::begin`]): the claim waits at most the lock timeout
/// for another delivery's transaction; the binding commits ([`Session::commit`]) after
/// [`super::Protocol::complete`], or rolls back when the body raised.
impl Channel for Session {
    fn transactional(&self) -> bool {
        true
    }

    fn claim(
        &mut self,
        interrupt: &Interrupt<'_>,
        request: &ClaimRequest,
        lock_timeout_seconds: f64,
    ) -> Result<ClaimReply> {
        Session::claim(self, interrupt, request, lock_timeout_seconds)
    }

    fn fenced_with_result(
        &mut self,
        interrupt: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        Session::fenced_with_result(
            self,
            interrupt,
            change,
            &claim.job_type,
            &claim.operation_key,
            claim.token,
            text,
            result,
        )
    }
}
