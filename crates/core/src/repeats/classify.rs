//! Classifying an operation's repeats ([`classify`]) by the rules the module documents.

use std::collections::HashMap;

use serde_json::Value;

use super::facts::{decision, id_of, integer, retries, seconds, text, truthy};
use super::{Cause, Facts, Repeat, WON};

/// What a later receive of an SQS message (same id, a higher `receive_count`) is, from
/// what its previous receive was answered: after `in_progress` the door deferred it
/// (made it visible again after `retry_after`), so it is that deferred copy back
/// (`Some(true)`); after a won claim answered `claimed` again, the claim was released
/// (the body raised and the door left the message): the queue's retry (`Some(false)`).
/// Anything else (a takeover of the dead consumer's claim, meeting it live, a
/// completion) is left to the general rules (`None`): a redelivery.
pub fn sqs_return(facts: &Facts, earlier: &Facts) -> Option<bool> {
    let count = |f: &Facts| f.get("receive_count").and_then(Value::as_i64);
    match (count(facts), count(earlier)) {
        (Some(now), Some(before)) if now > before => match (decision(earlier), decision(facts)) {
            (Some("in_progress"), _) => Some(true),
            (Some(won), Some("claimed")) if WON.contains(&won) => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Whether the delivery met a live claim: answered "in progress", or answered
/// "completed" (or recorded without facts, as a transactional claim's copies are)
/// although it arrived (`at`) before the completion (`completed_at`), epoch seconds.
fn live_claim(facts: &Facts, at: Option<f64>, completed_at: Option<f64>) -> bool {
    let answered_completed = match facts.get("decision") {
        None => true,
        Some(v) => v.as_str() == Some("completed"),
    };
    decision(facts) == Some("in_progress")
        || (answered_completed && matches!((at, completed_at), (Some(a), Some(c)) if a < c))
}

fn since(at: Option<f64>, start: Option<f64>) -> Option<f64> {
    Some(at? - start?)
}

/// Classifies each delivery after the first.
///
/// `deliveries`: an operation's deliveries in arrival order, the first claim's first
/// (facts as the module describes). `completed_at`: when the operation completed, epoch
/// seconds (a `completed` answer to a delivery that arrived earlier means it waited for
/// that commit). `restarts`: recorded deploy/restart times, epoch seconds.
/// `restart_window`: seconds after a restart within which a redelivery is matched to it.
/// Returns one [`Repeat`] per delivery after the first (none for no deliveries).
pub fn classify(
    deliveries: &[Facts],
    completed_at: Option<f64>,
    restarts: &[f64],
    restart_window: f64,
) -> Vec<Repeat> {
    let Some(first) = deliveries.first() else {
        return Vec::new();
    };
    let claimed_at = first.get("at").and_then(seconds);
    let first_producer = text(first.get("producer"));
    let mut producers: Vec<String> = first_producer.iter().cloned().collect();
    // id => (latest facts, the cause of its first arrival as a repeat)
    let mut seen: HashMap<String, (&Facts, Option<Cause>)> = HashMap::new();
    if let Some(id) = id_of(first) {
        seen.insert(id, (first, None));
    }
    let mut claims = Vec::with_capacity(deliveries.len()); // per repeat: when the claim before it was won
    let mut won = claimed_at;
    let mut repeats: Vec<Repeat> = Vec::with_capacity(deliveries.len());
    for facts in &deliveries[1..] {
        claims.push(won);
        let at = facts.get("at").and_then(seconds);
        if decision(facts).is_some_and(|d| WON.contains(&d)) {
            won = at.or(won);
        }
        let id = id_of(facts);
        let earlier = id.as_ref().and_then(|id| seen.get(id)).copied();
        let live = live_claim(facts, at, completed_at);
        let producer = text(facts.get("producer"));
        let (cause, returned) = if !facts.contains_key("decision") {
            (
                if live {
                    Cause::ConcurrentCopy
                } else {
                    Cause::Unknown
                },
                false,
            )
        } else if let Some((earlier, first_cause)) = earlier {
            let sqs = sqs_return(facts, earlier);
            if retries(facts) > retries(earlier) || sqs == Some(false) {
                (Cause::QueueRetry, false)
            } else if integer(facts.get("deferrals")) > 0 || sqs == Some(true) {
                (first_cause.unwrap_or(Cause::ConcurrentCopy), true)
            } else {
                (Cause::Redelivery, false)
            }
        } else if live {
            (Cause::ConcurrentCopy, false)
        } else {
            match &producer {
                Some(p) if !producers.is_empty() => {
                    if producers.contains(p) {
                        (Cause::ReEnqueueSameProducer, false)
                    } else {
                        (Cause::ReEnqueueOtherProducer, false)
                    }
                }
                _ => (Cause::ReEnqueue, false),
            }
        };
        let enqueued = facts
            .get("enqueued_at")
            .and_then(seconds)
            .or_else(|| facts.get("created_at").and_then(seconds));
        let retry_count = match truthy(facts.get("retry_count")) {
            Some(v) => v.as_i64(),
            None => truthy(facts.get("executions"))
                .and_then(Value::as_i64)
                .map(|e| e.saturating_sub(1)),
        };
        if let Some(id) = &id {
            let first_cause = earlier.and_then(|(_, c)| c).unwrap_or(cause);
            seen.insert(id.clone(), (facts, Some(first_cause)));
        }
        if let Some(p) = &producer {
            if !producers.contains(p) {
                producers.push(p.clone());
            }
        }
        repeats.push(Repeat {
            at,
            id,
            cause,
            after_claim: since(at, claimed_at),
            after_enqueue: since(at, enqueued),
            retry_count,
            producer,
            first_producer: first_producer.clone(),
            live_claim: live,
            deferred_return: returned,
            restart: None,
            decision: decision(facts).map(str::to_owned),
        });
    }
    took_over(&mut repeats);
    for (r, claimed) in repeats.iter_mut().zip(claims) {
        if r.cause == Cause::Redelivery && !r.deferred_return {
            r.restart = restart_near(r.at, claimed, restarts, restart_window);
        }
    }
    repeats
}

/// A delivery that took over an expired lease redid a dead worker's claim: it and its
/// earlier arrivals (a copy deferred behind that claim until the lease ran out) are
/// redeliveries.
fn took_over(repeats: &mut [Repeat]) {
    for i in 0..repeats.len() {
        if repeats[i].decision.as_deref() != Some("takeover") {
            continue;
        }
        match repeats[i].id.clone() {
            Some(id) => {
                for r in repeats.iter_mut() {
                    if r.id.as_deref() == Some(id.as_str()) && r.cause != Cause::QueueRetry {
                        r.cause = Cause::Redelivery;
                    }
                }
            }
            None => repeats[i].cause = Cause::Redelivery,
        }
    }
}

/// The latest restart at or before `at`, within `window` seconds, after the claim the
/// delivery redoes (`claimed`): a restart before that claim did not cause it.
fn restart_near(
    at: Option<f64>,
    claimed: Option<f64>,
    restarts: &[f64],
    window: f64,
) -> Option<f64> {
    let at = at?;
    restarts
        .iter()
        .copied()
        .filter(|&r| at >= r && at - r <= window && claimed.is_none_or(|c| r > c))
        .max_by(f64::total_cmp)
}
