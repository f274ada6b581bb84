//! One delivery as the door sees it ([`DeliveryRequest`]).

use std::time::{Duration, Instant};

use crate::record::ClaimRequest;

use super::*;

/// One delivery of one operation, as the binding's door sees it.
#[derive(Debug, Clone, Default)]
pub struct DeliveryRequest {
    /// The job type (idempotency scope), e.g. `"ChargeOrderJob"`.
    pub job_type: String,
    /// The canonical operation key, e.g. `"42"`.
    pub operation_key: String,
    /// The delivery's id in its queue (Sidekiq's jid, ActiveJob's job_id, Celery's task
    /// id, an SQS message id), stored as the record's last claiming delivery.
    pub delivery_id: Option<String>,
    /// The job class, queue and arguments (JSON text), stored for a rerun.
    pub job_class: Option<String>,
    /// The queue the delivery came from (see `job_class`).
    pub queue: Option<String>,
    /// The delivery's arguments, as JSON text (see `job_class`).
    pub args_json: Option<String>,
    /// Digest of the delivery's canonical payload (mismatch detection); `None`: not
    /// compared.
    pub args_digest: Option<String>,
    /// The door's facts about this delivery (a JSON object text) for the repeats
    /// report, or `None`.
    pub facts_json: Option<String>,
    /// Deferrals this delivery already had (each [`Step::InProgress`] the door acted
    /// on adds one): the deferral's delay doubles with each.
    pub deferrals: u32,
    /// Seconds to wait, when the claim is live, for it to end before deciding again:
    /// [`Protocol::begin`] then answers [`Step::InProgress`] with
    /// [`Outcome::wait_seconds`] and the binding calls [`Protocol::wait`] (a completion
    /// then replays, a release may run); `None`: no wait (the delivery is deferred at
    /// once). Only on a channel that can wait ([`Channel::can_wait`]: not a transaction).
    pub wait_seconds: Option<f64>,
    /// When the work before the body must have ended, whatever the database does (a
    /// call with `wait`: [`DeliveryRequest::bound_wait`]); `None`: each database call's
    /// own deadline only. [`Protocol::begin`] and [`Protocol::wait`] cut every
    /// database call at it (the deadline's [`crate::error::Error::Timeout`]).
    pub wait_until: Option<Instant>,
}

/// The reason a hold by the reclaim budget stores in `last_error` and tells in the
/// `held` event and log line: `takeovers` stale takeovers of the operation, more than
/// `max_takeovers`. Begins with [`crate::sql::RECLAIM_BUDGET_SPENT`] (what `/metrics`
/// counts such holds by).
pub fn reclaim_budget_reason(takeovers: i32, max_takeovers: i32) -> String {
    let noun = if takeovers == 1 {
        "takeover"
    } else {
        "takeovers"
    };
    format!(
        concat!(
            crate::sql::reclaim_budget_spent!(),
            ": {} stale {} of this operation, max_takeovers {}"
        ),
        takeovers, noun, max_takeovers
    )
}

/// Seconds a call with `wait: N` may take beyond N before its body starts or it
/// returns or raises ([`DeliveryRequest::bound_wait`]): the claim, the wait and the
/// decision after it all end within N + this, even with PostgreSQL refusing or never
/// answering.
pub const WAIT_MARGIN_SECONDS: f64 = 0.5;

impl DeliveryRequest {
    /// Starts the bound of a call with `wait_seconds` (call it when the call starts):
    /// `wait_until` = now + `wait_seconds` + [`WAIT_MARGIN_SECONDS`]; no bound without
    /// a wait, nor for one past what the clock can hold (1e300 s: the wait itself then
    /// refuses it, [`Protocol::wait`]'s configuration error), never a panic.
    pub fn bound_wait(&mut self) {
        self.wait_until = self.wait_seconds.and_then(|w| {
            let bound = Duration::try_from_secs_f64(w.max(0.0) + WAIT_MARGIN_SECONDS).ok()?;
            Instant::now().checked_add(bound)
        });
    }

    /// Writes the delivery's payload (its canonical JSON text and digest,
    /// [`crate::canonical::text_and_digest`]) and its facts (a JSON object's text, or
    /// none), each as the binding converted it from its language's values (`Err`: the
    /// binding's words for why JSON cannot carry it). The one place both bindings build
    /// a delivery's JSON from.
    ///
    /// Errors: [`crate::canonical::unwritable`] (a ConfigurationError naming the job and
    /// what could not be written), before anything is claimed.
    pub fn write_payload(
        &mut self,
        payload: std::result::Result<serde_json::Value, String>,
        facts: Option<std::result::Result<serde_json::Value, String>>,
    ) -> crate::error::Result<()> {
        let refuse = |what: &str, problem: String| {
            crate::canonical::unwritable(&self.job_type, what, &problem)
        };
        let payload = payload.map_err(|problem| refuse("payload", problem))?;
        let facts = facts
            .transpose()
            .map_err(|problem| refuse("facts", problem))?;
        let (text, digest) = crate::canonical::text_and_digest(&payload);
        self.args_json = Some(text);
        self.args_digest = Some(digest);
        self.facts_json = facts.map(|f| f.to_string());
        Ok(())
    }

    /// The claim statement's request for this delivery under `options`.
    pub fn claim_request(&self, options: &JobOptions) -> ClaimRequest {
        ClaimRequest {
            job_type: self.job_type.clone(),
            operation_key: self.operation_key.clone(),
            delivery_id: self.delivery_id.clone(),
            lease_seconds: options.lease_seconds,
            args_digest: self.args_digest.clone(),
            job_class: self.job_class.clone(),
            queue: self.queue.clone(),
            args_json: self.args_json.clone(),
            refuse_mismatch: options.on_mismatch == OnMismatch::Raise,
            facts_json: self.facts_json.clone(),
            returning: self.deferrals > 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_payload_writes_canonical_text_and_refuses_by_part() {
        let mut delivery = DeliveryRequest {
            job_type: "Job".into(),
            ..DeliveryRequest::default()
        };
        let payload = serde_json::json!([{"b": 1, "a": 2}]);
        delivery
            .write_payload(Ok(payload.clone()), Some(Ok(serde_json::json!({"x": 1}))))
            .unwrap();
        let (text, digest) = crate::canonical::text_and_digest(&payload);
        assert_eq!(delivery.args_json.as_deref(), Some(text.as_str()));
        assert_eq!(delivery.args_digest.as_deref(), Some(digest.as_str()));
        assert_eq!(delivery.facts_json.as_deref(), Some(r#"{"x":1}"#));
        let refused = delivery
            .write_payload(Ok(payload), Some(Err("a NaN".into())))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("Job: the facts cannot be written as JSON (it holds a NaN)"));
        let refused = delivery.write_payload(Err("a NaN".into()), None);
        assert!(refused.unwrap_err().to_string().contains("the payload"));
    }
}
