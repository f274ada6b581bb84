//! One repeated delivery to record ([`Repeat`]), made from a delivery's request and the
//! claim's answer.

use chrono::{DateTime, Utc};

use crate::record::{ClaimAnswer, ClaimKind, ClaimReply, ClaimRequest, Replay, ResultState};

/// One repeated delivery to record.
#[derive(Debug, Clone)]
pub struct Repeat {
    /// The record's job type.
    pub job_type: String,
    /// The record's operation key.
    pub operation_key: String,
    /// The database time of the decision.
    pub at: DateTime<Utc>,
    /// The delivering job class: in the repeat's `repeat_facts` entry, and added to the
    /// record's `job_classes` when new.
    pub job_class: Option<String>,
    /// `completed`, `in_progress`, `held`, `given_up`, `refused`, `retry`, `takeover`.
    pub decision: &'static str,
    /// The door's delivery facts: a JSON object text, or none.
    pub facts: Option<String>,
    /// Counters still to add (a duplicate answered read-only); false when the claim
    /// statement already counted it.
    pub count: bool,
    /// A copy coming back ([`ClaimRequest::returning`]): counted when it first arrived,
    /// so it adds no `duplicates` or `mismatches` (its time, class and facts are still
    /// recorded).
    pub returning: bool,
    /// This delivery's arguments differed from the claim's.
    pub mismatch: bool,
    /// Answered from a completion made with `store_result` (a replay: V7).
    pub replayed: bool,
    /// The transaction that made the claim, when it was still open as the repeat was
    /// queued (Ruby's ActiveRecord mode: [`crate::sql::CLAIM_SQL`]'s `xid`, a full 64-bit
    /// transaction id): the `repeat_facts` entry is written only once that transaction
    /// committed, kept queued while it is in progress, and let go when it rolled back,
    /// since the claim's counting was rolled back with it (not counted in
    /// `Bookkeeper::dropped`: no count is lost; an id PostgreSQL cannot answer for is
    /// dropped and counted there) ([`FLUSH_AWAITING_SQL`](crate::sql::FLUSH_AWAITING_SQL)'s `awaiting`). None: written as it is (the
    /// claim committed already, or counts nothing). Only for a repeat the claim statement
    /// counted (`count` false): its counts, if any, are written without waiting.
    pub xid: Option<u64>,
}

impl Repeat {
    /// The repeat of `req`'s delivery, answered `decision` at the database time `at`;
    /// `count`: see [`Repeat::count`].
    pub fn new(req: &ClaimRequest, decision: &ClaimReply, at: DateTime<Utc>, count: bool) -> Self {
        Repeat {
            job_type: req.job_type.clone(),
            operation_key: req.operation_key.clone(),
            at,
            job_class: req.job_class.clone(),
            decision: decision.outcome.name(),
            facts: req.facts_json.clone(),
            count,
            returning: req.returning,
            mismatch: decision.mismatch,
            replayed: matches!(
                decision.outcome,
                ClaimAnswer::Completed {
                    replay: Some(Replay {
                        state: ResultState::Stored,
                        ..
                    }),
                    ..
                }
            ),
            xid: None,
        }
    }

    /// Whether this repeat adds one to `duplicates` (and its mismatch to
    /// `mismatches`): a repeat the claim statement did not count, on its first arrival.
    pub fn adds_duplicate(&self) -> bool {
        self.count && !self.returning
    }

    /// The repeat of a delivery the claim statement ([`crate::sql::CLAIM_SQL`])
    /// decided (it counted itself): none for a first claim.
    pub fn after_claim(
        req: &ClaimRequest,
        decision: &ClaimReply,
        at: DateTime<Utc>,
    ) -> Option<Self> {
        let first = matches!(
            decision.outcome,
            ClaimAnswer::Claimed {
                kind: ClaimKind::First,
                ..
            }
        );
        (!first).then(|| Repeat::new(req, decision, at, false))
    }
}
