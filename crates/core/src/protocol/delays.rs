//! The delays a door waits: the deferral's, the unreachable database's, the completion's
//! retries, and the rate of a failing claim's log lines.

use std::time::{Duration, Instant};

/// Seconds before a deferred delivery's first return ([`deferral_delay`]).
pub const DEFERRAL_FIRST_DELAY: f64 = 1.0;
/// Growth of the deferral's delay per deferral already had ([`deferral_delay`]).
pub const DEFERRAL_FACTOR: f64 = 2.0;
/// Seconds waited before each new attempt of a failed completion outside a
/// transaction: 7 attempts in all (each bounded by the deadline), 15.3 s of pauses,
/// longer than a PostgreSQL restart takes.
pub const COMPLETION_RETRY_DELAYS: [f64; 6] = [0.05, 0.25, 1.0, 2.0, 4.0, 8.0];

/// The most deferrals (or failed claims) a delivery may say it met: its count travels
/// in the queue's message (a Celery header, a Sidekiq payload field, SQS's receive
/// count), so a producer may write anything there ([`deferral_delay`]'s `deferrals`):
/// a `u32`.
pub const MAX_DEFERRALS: u32 = u32::MAX;

/// The refusal of a delivery whose deferral count is no count, one wording for every
/// door: [`crate::error::Error::Config`] "`job`: `subject` must be a whole number from
/// 0 to 4294967295, got `shown`; the job was not run and nothing was recorded".
/// `subject` is the door's name for the count (Ruby's "the delivery's deferrals
/// (idempotency_deferrals)", Python's "perform_once's deferrals"), `shown` the value in
/// the host's notation (cut to 100 characters here).
pub fn deferrals_refused(job: &str, subject: &str, shown: &str) -> crate::error::Error {
    count_refused(job, subject, 0, shown)
}

/// The one wording of a count refused ([`deferrals_refused`], [`delivery_count`]): a
/// whole number from `first` to `first` + [`MAX_DEFERRALS`]; `shown` cut to 100
/// characters.
fn count_refused(job: &str, what: &str, first: u32, shown: &str) -> crate::error::Error {
    let shown: String = shown.chars().take(100).collect();
    let last = u64::from(first) + u64::from(MAX_DEFERRALS);
    crate::error::Error::Config(format!(
        "{job}: {what} must be a whole number from {first} to {last}, got {shown}; the job {}",
        crate::error::NOT_RUN
    ))
}

/// The deferral's delay: seconds until a delivery that met a live claim comes back.
/// Soon at first ([`DEFERRAL_FIRST_DELAY`]), doubling with each deferral the delivery
/// already had, never later than the holder's lease end plus `margin_seconds`, so it
/// is there when a dead holder's lease runs out. Coming back early is safe: the claim
/// statement decides again.
pub fn deferral_delay(lease_remaining: f64, deferrals: u32, margin_seconds: f64) -> f64 {
    let latest = lease_remaining.max(0.0) + margin_seconds;
    let backoff = DEFERRAL_FIRST_DELAY * DEFERRAL_FACTOR.powi(deferrals.min(30) as i32);
    backoff.min(latest)
}

/// A count a delivery carries in its message (`what`: the door's words for where, e.g.
/// "the header idempotent_job_deferrals"), given as its decimal `text` (`None`: the value
/// is not a whole number at all; `shown`: the value as the host language writes it), as
/// a whole number from `first` to `first` + [`MAX_DEFERRALS`].
///
/// Errors: [`Error::Config`](crate::error::Error::Config) naming `job`, `what`, the
/// range and `shown`, saying the job was not run: a sign, a fraction, an exponent, text
/// or a number out of range.
pub fn delivery_count(
    job: &str,
    what: &str,
    text: Option<&str>,
    shown: &str,
    first: u32,
) -> crate::error::Result<u64> {
    let last = u64::from(first) + u64::from(MAX_DEFERRALS);
    text.filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|n| (u64::from(first)..=last).contains(n))
        .ok_or_else(|| count_refused(job, what, first, shown))
}

/// Longest delay, in seconds, before a delivery whose claim could not be made
/// (PostgreSQL unreachable or a retryable error) comes back ([`unreachable_delay`]).
pub const UNREACHABLE_MAX_DELAY: f64 = 60.0;

/// Seconds until a delivery comes back after a retryable error before its body started
/// (the claim could not be made or answered): the deferral's back-off
/// ([`DEFERRAL_FIRST_DELAY`] doubling per such failure already had, `failures` counts
/// them before this one) capped at [`UNREACHABLE_MAX_DELAY`]. For a door whose queue
/// would otherwise drop the delivery (Celery acknowledges a failed task's message).
pub fn unreachable_delay(failures: u32) -> f64 {
    deferral_delay(UNREACHABLE_MAX_DELAY, failures, 0.0)
}

/// Seconds between two error log lines of a door for claims failing with the same
/// cause ([`claim_error_report`]): a database down or misconfigured fails every
/// delivery, and one line per interval names the cause without a line per message.
pub const CLAIM_ERROR_LOG_INTERVAL: f64 = 60.0;

/// Whether a door logs, now, the error line for a claim failing with `cause` (a
/// short text naming the cause, e.g. the error's class and SQLSTATE): `Some(n)` the
/// first time and then at most once per [`CLAIM_ERROR_LOG_INTERVAL`] per process,
/// `n` counting the failures of that cause not logged since the last line; `None`
/// otherwise (the door logs that delivery at debug level only).
pub fn claim_error_report(cause: &str) -> Option<u64> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<String, (Instant, u64)>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let now = Instant::now();
    let interval = Duration::from_secs_f64(CLAIM_ERROR_LOG_INTERVAL);
    match seen.get_mut(cause) {
        Some((last, skipped)) if now.duration_since(*last) < interval => {
            *skipped += 1;
            None
        }
        Some((last, skipped)) => {
            let n = *skipped;
            *last = now;
            *skipped = 0;
            Some(n)
        }
        None => {
            seen.insert(cause.to_string(), (now, 0));
            Some(0)
        }
    }
}

#[cfg(test)]
mod deferral_count_tests {
    use super::*;

    #[test]
    fn a_deferral_count_refused_has_one_wording() {
        assert_eq!(
            deferrals_refused("J", "perform_once's deferrals", "'1'").to_string(),
            "J: perform_once's deferrals must be a whole number from 0 to 4294967295, got '1'; \
             the job was not run and nothing was recorded"
        );
        let long = "x".repeat(300);
        assert!(deferrals_refused("J", "d", &long)
            .to_string()
            .contains(&format!("got {}; the job", "x".repeat(100))));
    }
}

#[cfg(test)]
mod count_tests {
    use super::*;

    #[test]
    fn a_delivery_count_is_a_whole_number_in_its_range() {
        assert_eq!(delivery_count("J", "h", Some("0"), "0", 0).unwrap(), 0);
        assert_eq!(
            delivery_count("J", "h", Some("4294967295"), "x", 0).unwrap(),
            4_294_967_295
        );
        assert_eq!(
            delivery_count("J", "h", Some("4294967296"), "x", 1).unwrap(),
            4_294_967_296
        );
        for text in [
            None,
            Some(""),
            Some("-1"),
            Some("1.5"),
            Some("1e3"),
            Some(" 2"),
            Some("4294967296"),
        ] {
            assert!(delivery_count("J", "h", text, "v", 0).is_err(), "{text:?}");
        }
        let refused = delivery_count("Job", "the header h", Some("0"), "'0'", 1).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "Job: the header h must be a whole number from 1 to 4294967296, got '0'; the job was \
             not run and nothing was recorded"
        );
    }
}
