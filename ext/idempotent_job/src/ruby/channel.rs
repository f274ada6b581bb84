//! The two Ruby-made places a delivery's statements go, each a core [`Channel`]: the
//! gem's own native transaction ([`TxChannel`]) and a Ruby session ([`SessionChannel`]:
//! ActiveRecord's connection); the third, the store's pool, is the core's
//! [`idempotent_job_core::protocol::Replaceable`]. `perform.rs` drives a delivery over
//! one of them.

use std::cell::RefCell;

use chrono::{DateTime, Utc};
use magnus::{value::ReprValue, RArray, RHash, Ruby, Value};

use super::convert::{decided_for, transaction_id, RbResult};
use super::protocol::request_hash;
use super::transaction::NativeTransaction;
use idempotent_job_core::bookkeeping::Repeat;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::fenced::Fenced;
use idempotent_job_core::protocol::{Channel, ClaimInfo};
use idempotent_job_core::record::{ClaimReply, ClaimRequest, PreparedResult};

/// A native transaction's session, taken for one statement at a time (the body writes
/// through the same transaction between them).
pub struct TxChannel<'a>(pub(super) &'a NativeTransaction);

impl Channel for TxChannel<'_> {
    fn transactional(&self) -> bool {
        true
    }

    fn claim(&mut self, i: &Interrupt<'_>, r: &ClaimRequest, lock: f64) -> Result<ClaimReply> {
        self.0.on_session(|s| Channel::claim(s, i, r, lock))
    }

    fn fenced_with_result(
        &mut self,
        i: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        self.0
            .on_session(|s| Channel::fenced_with_result(s, i, change, claim, text, result))
    }
}

/// The error a [`SessionChannel`] call returns when Ruby raised: the Ruby exception
/// itself is kept in the shared slot and raised instead.
pub(super) const RAISED_IN_RUBY: &str = "raised in the Ruby session";

/// A [`Channel`] over a Ruby session (`Transactional::ActiveRecord`: ActiveRecord's
/// connection, inside its transaction), called with the GVL held (its host never
/// releases it). The session answers `claim_row(request, lock_timeout)` → `[row,
/// token]` (the claim statement's typed row, with its `decided_at` in Float epoch
/// seconds, and the token it sent; the decision is the core's, [`decided_for`] over the
/// channel's own request, never read back from the Hash Ruby was given),
/// `outermost?` (asked after a repeat's claim: false when the session joined an outer
/// transaction, whose rollback would undo the claim: its repeat is then not queued),
/// `rolled_back_on_raise?` (asked when the body raised: false when the claim must be
/// released in that outer transaction) and
/// `fenced_raw(change, job_type, operation_key, token, text[, [json, state]])`.
pub struct SessionChannel<'a> {
    pub(super) session: Value,
    pub(super) raised: &'a RefCell<Option<magnus::Error>>,
    /// The repeat bookkeeping (`repeat_facts`) of the claim, when it was a repeat (a
    /// duplicate, a retry, a takeover): queued by `perform` once the delivery ended
    /// without an error (see `NativeProtocol::perform`), not here, inside the claim.
    pub(super) repeat: Option<Repeat>,
}

// SAFETY: a SessionChannel is only used on the Ruby thread that made it, with the GVL
// held: its host ([`RbHost::blocking`] with `release_gvl` false) runs every statement
// on that thread, never on another one.
unsafe impl Send for SessionChannel<'_> {}

impl SessionChannel<'_> {
    fn hold(&self, err: magnus::Error) -> Error {
        *self.raised.borrow_mut() = Some(err);
        Error::Panic(RAISED_IN_RUBY.into())
    }

    fn ruby() -> Ruby {
        // SAFETY (see the Send impl): always on a Ruby thread with the GVL held.
        Ruby::get().expect("a Ruby session is used on a Ruby thread")
    }
}

impl Channel for SessionChannel<'_> {
    fn transactional(&self) -> bool {
        true
    }

    /// The session's `rolled_back_on_raise?`: false when it joined a transaction the
    /// caller opened, which commits the claim if the caller rescues the body's error.
    fn rolled_back_on_raise(&self) -> bool {
        self.session
            .funcall::<_, _, bool>("rolled_back_on_raise?", ())
            .unwrap_or(true)
    }

    fn claim(&mut self, _i: &Interrupt<'_>, r: &ClaimRequest, lock: f64) -> Result<ClaimReply> {
        let ruby = Self::ruby();
        let asked = (|| -> RbResult<ClaimReply> {
            let hash = request_hash(&ruby, r)?;
            let pair: RArray = self.session.funcall("claim_row", (hash, lock))?;
            let (row, token): (RHash, String) = (pair.entry(0)?, pair.entry(1)?);
            let decided_at: Option<f64> = row.lookup(ruby.sym_new("decided_at"))?;
            let reply = decided_for(&ruby, row, &token, r)?;
            let at = decided_at
                .and_then(|seconds| {
                    DateTime::<Utc>::from_timestamp_micros((seconds * 1e6).round() as i64)
                })
                .unwrap_or_else(Utc::now);
            self.repeat = Repeat::after_claim(r, &reply, at);
            if self.repeat.is_some() && !self.session.funcall::<_, _, bool>("outermost?", ())? {
                self.repeat = None;
            }
            if let Some(repeat) = &mut self.repeat {
                // Queued before ActiveRecord commits: its `repeat_facts` entry waits for
                // this transaction's commit, and is dropped if it rolls back.
                repeat.xid = transaction_id(&ruby, row)?;
            }
            Ok(reply)
        })();
        asked.map_err(|e| self.hold(e))
    }

    fn fenced_with_result(
        &mut self,
        _i: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        let ruby = Self::ruby();
        let (name, job_type, key, token) = (
            // The completion's statement on this driver is the plain one.
            ruby.sym_new(match change {
                Fenced::CompleteAsynchronously => "complete",
                other => other.name(),
            }),
            claim.job_type.as_str(),
            claim.operation_key.as_str(),
            claim.token.to_string(),
        );
        let applied: RbResult<Value> = match result {
            None => self
                .session
                .funcall("fenced_raw", (name, job_type, key, token, text)),
            Some(result) => {
                let pair = ruby.ary_new_capa(2);
                pair.push(result.json.clone())
                    .and_then(|()| pair.push(result.state.as_str()))
                    .and_then(|()| {
                        self.session
                            .funcall("fenced_raw", (name, job_type, key, token, text, pair))
                    })
            }
        };
        applied.map(|_| ()).map_err(|e| self.hold(e))
    }
}
