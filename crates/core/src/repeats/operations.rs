//! The report's operations: each report row with its deliveries and classified repeats.

use serde_json::Value;

use super::facts::{epoch, text, truthy};
use super::{classify, row_deliveries, Facts, Repeat};
use crate::error::{Error, Result};
use crate::records::Repeated;

/// One repeated operation of the report: the record's counts, its deliveries and its
/// classified repeats.
#[derive(Clone, Debug)]
pub struct RepeatedOperation {
    /// The report SQL's row.
    pub row: Repeated,
    /// Its deliveries ([`row_deliveries`]), the first claim's first.
    pub deliveries: Vec<Facts>,
    /// The producers that enqueued it, the first enqueue's first, each once.
    pub producers: Vec<String>,
    /// Repeats answered from a completion made with a stored result.
    pub replays: usize,
    /// Its repeats, arrival order ([`classify`]).
    pub repeats: Vec<Repeat>,
}

impl Repeat {
    /// The repeat as a JSON object: `at`, `after_claim`, `after_enqueue`, `restart`
    /// (epoch seconds / seconds, or null), `id`, `producer`, `first_producer`,
    /// `decision` (text or null), `cause` ([`Cause::name`](super::Cause::name)), `retry_count` (integer or
    /// null), `live_claim`, `deferred_return` (booleans): the Python package's dict,
    /// the Ruby Struct's members.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "at": self.at, "id": self.id, "cause": self.cause.name(),
            "after_claim": self.after_claim, "after_enqueue": self.after_enqueue,
            "retry_count": self.retry_count, "producer": self.producer,
            "first_producer": self.first_producer, "live_claim": self.live_claim,
            "deferred_return": self.deferred_return, "restart": self.restart,
            "decision": self.decision,
        })
    }
}

impl RepeatedOperation {
    /// The operation as a JSON object: `job_type`, `operation_key`, `status` (text),
    /// `attempts`, `takeovers`, `duplicates`, `mismatches`, `replays` (integers),
    /// `first_claimed_at`, `completed_at` (epoch seconds or null), `producers`,
    /// `job_classes` (arrays of text) and `repeats` (arrival order, [`Repeat::to_json`]).
    pub fn to_json(&self) -> Value {
        let r = &self.row;
        serde_json::json!({
            "job_type": r.job_type, "operation_key": r.operation_key, "status": r.status,
            "attempts": r.attempts, "takeovers": r.takeovers, "duplicates": r.duplicates,
            "mismatches": r.mismatches, "replays": self.replays,
            "first_claimed_at": epoch(&r.first_claimed_at),
            "completed_at": r.completed_at.as_ref().map(epoch),
            "producers": self.producers, "job_classes": r.job_classes,
            "repeats": self.repeats.iter().map(Repeat::to_json).collect::<Vec<_>>(),
        })
    }
}

/// The report's operations from the report SQL's rows (see [`crate::operations::repeats`]),
/// each repeat classified; `restarts` (epoch seconds) and `restart_window` (seconds) as
/// [`classify`] takes them.
///
/// Errors: [`Error::Config`] for a negative or non-finite window, or a row whose JSON
/// text is damaged.
pub fn operations(
    rows: Vec<Repeated>,
    restarts: &[f64],
    restart_window: f64,
) -> Result<Vec<RepeatedOperation>> {
    check_window(restart_window)?;
    rows.into_iter()
        .map(|row| {
            let deliveries = row_deliveries(&row)?;
            let mut producers: Vec<String> = Vec::new();
            for p in deliveries.iter().filter_map(|d| text(d.get("producer"))) {
                if !producers.contains(&p) {
                    producers.push(p);
                }
            }
            let replays = deliveries
                .iter()
                .filter(|d| truthy(d.get("replayed")).is_some())
                .count();
            let repeats = classify(
                &deliveries,
                row.completed_at.as_ref().map(epoch),
                restarts,
                restart_window,
            );
            Ok(RepeatedOperation {
                row,
                deliveries,
                producers,
                replays,
                repeats,
            })
        })
        .collect()
}

/// The earliest time the report takes, in epoch seconds (0001-01-01T00:00:00Z).
pub const MIN_EPOCH_SECONDS: f64 = -62_135_596_800.0;
/// The latest time the report takes, in epoch seconds (9999-12-31T23:59:59Z).
pub const MAX_EPOCH_SECONDS: f64 = 253_402_300_799.0;

/// A time the report is asked about (`name`: "since", "restarts"), in epoch seconds
/// (`None`: not a number the host could read as one; `shown`: the value as the host
/// language writes it).
///
/// Errors: [`Error::Config`] naming `name`, the range and `shown` for NaN, an infinity
/// or a time outside [`MIN_EPOCH_SECONDS`]..=[`MAX_EPOCH_SECONDS`] (years 1 to 9999).
pub fn check_time(name: &str, seconds: Option<f64>, shown: &str) -> Result<f64> {
    seconds
        .filter(|s| (MIN_EPOCH_SECONDS..=MAX_EPOCH_SECONDS).contains(s))
        .ok_or_else(|| {
            Error::Config(format!(
                "repeats: {name} must be epoch seconds from {MIN_EPOCH_SECONDS} (0001-01-01) \
                 to {MAX_EPOCH_SECONDS} (9999-12-31), got {shown}"
            ))
        })
}

/// Checks a repeats report's `restart_window` (seconds) before any row is read.
///
/// Errors: [`Error::Config`] unless `restart_window` is a finite number of seconds, 0 or more.
pub fn check_window(restart_window: f64) -> Result<()> {
    if restart_window.is_finite() && restart_window >= 0.0 {
        Ok(())
    } else {
        Err(window_refused(&restart_window.to_string()))
    }
}

/// The refusal of a repeats report's `restart_window`, shown as the binding shows the
/// value it was given: [`check_window`]'s for a number out of range; a binding's for a
/// value that is no number of seconds (`true`, `nil`/`None`, `"90"`), never read as one.
pub fn window_refused(shown: &str) -> Error {
    Error::Config(format!(
        "restart_window must be a finite number of seconds, 0 or more, got {shown}"
    ))
}

#[cfg(test)]
mod time_tests {
    use super::*;

    #[test]
    fn a_report_time_is_in_years_1_to_9999() {
        assert_eq!(check_time("since", Some(0.0), "0").unwrap(), 0.0);
        assert!(check_time("since", Some(MIN_EPOCH_SECONDS), "x").is_ok());
        assert!(check_time("since", Some(MAX_EPOCH_SECONDS), "x").is_ok());
        for seconds in [
            None,
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(1e20),
            Some(-1e12),
        ] {
            assert!(check_time("since", seconds, "v").is_err(), "{seconds:?}");
        }
        assert_eq!(
            check_time("restarts", Some(f64::NAN), "nan")
                .unwrap_err()
                .to_string(),
            "repeats: restarts must be epoch seconds from -62135596800 (0001-01-01) to \
             253402300799 (9999-12-31), got nan"
        );
    }
}
