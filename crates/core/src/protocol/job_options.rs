//! A job type's protocol options ([`JobOptions`]), with their defaults from the core's
//! options table.

use crate::config::MAX_LEASE_SECONDS;
use crate::error::{Error, Result};

use super::*;

/// Shortest lease accepted, in seconds: below it a heartbeat cannot renew in time.
pub const MIN_LEASE_SECONDS: f64 = crate::options::MIN_LEASE_SECONDS;

/// One job type's resolved protocol options (the binding resolves its language's
/// declaration and the configured defaults into this, once per job class).
///
/// Names and defaults follow the Ruby options (`lease`, `on_stale`, `on_mismatch`,
/// `lookup`, `heartbeat`, `max_run`, `lock_timeout`, the `defer_margin` setting) and
/// `store_result` of the stored-results work; the defaults are read from the core's
/// options table ([`crate::options::JOB_OPTIONS`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    /// Lease in seconds ([`MIN_LEASE_SECONDS`]..=[`MAX_LEASE_SECONDS`]). Default 300.
    pub lease_seconds: f64,
    /// The stale policy. Default [`OnStale::Reclaim`].
    pub on_stale: OnStale,
    /// The mismatch rule. Default [`OnMismatch::Log`].
    pub on_mismatch: OnMismatch,
    /// `Some(label)` when a lookup is declared: a takeover then answers
    /// [`Step::AskLookup`], and `label` names it in log lines and errors (e.g.
    /// `"lookup #find_charge"`, `"lookup"`). `None`: no lookup. Default `None`.
    pub lookup: Option<String>,
    /// Renew the lease while the body runs (outside a transaction). Default true.
    pub heartbeat: bool,
    /// Seconds after which the heartbeat stops renewing, so a hung body loses its
    /// claim. Default 3600.
    pub max_run_seconds: f64,
    /// Seconds a transactional claim waits for another delivery's transaction
    /// (`lock_timeout`). Default 5. Unused by [`Direct`].
    pub lock_timeout_seconds: f64,
    /// Seconds added past the holder's lease end to the deferral's delay
    /// ([`deferral_delay`]). Default 1.
    pub defer_margin_seconds: f64,
    /// Store the body's value with the completion ([`Protocol::complete_prepared`]):
    /// a repeat of the completed operation replays it ([`Outcome::result_json`]).
    /// Default false.
    pub store_result: bool,
    /// The reclaim budget: `Some(n)` once `n` stale takeovers of one operation have
    /// been made, the next one is held for a person (after its lookup, if one is
    /// declared and does not know) whatever [`JobOptions::on_stale`] says. `None`
    /// (the default): no budget.
    pub max_takeovers: Option<i32>,
}

/// Seconds the deferral adds past the holder's lease end when no `defer_margin`
/// setting says otherwise.
pub const DEFAULT_DEFER_MARGIN_SECONDS: f64 = 1.0;

/// The default of the job option `name` in the core's options table
/// ([`crate::options::JOB_OPTIONS`]), the one place defaults are stated.
fn table_default(name: &str) -> crate::options::Default {
    crate::options::find(name)
        .map(|o| o.default)
        .unwrap_or(crate::options::Default::None)
}

fn seconds_default(name: &str) -> f64 {
    match table_default(name) {
        crate::options::Default::Seconds(s) => s,
        other => unreachable!("the options table's {name} default is {other:?}, not seconds"),
    }
}

fn boolean_default(name: &str) -> bool {
    match table_default(name) {
        crate::options::Default::Boolean(b) => b,
        other => unreachable!("the options table's {name} default is {other:?}, not a boolean"),
    }
}

fn choice_default(name: &str) -> &'static str {
    match table_default(name) {
        crate::options::Default::Choice(c) => c,
        other => unreachable!("the options table's {name} default is {other:?}, not a choice"),
    }
}

/// Every default read from the core's options table ([`crate::options::JOB_OPTIONS`]);
/// `defer_margin_seconds` is [`DEFAULT_DEFER_MARGIN_SECONDS`] (a setting, not a job
/// option).
impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            lease_seconds: seconds_default("lease"),
            on_stale: OnStale::parse("", choice_default("on_stale")).unwrap_or_default(),
            on_mismatch: OnMismatch::parse("", choice_default("on_mismatch")).unwrap_or_default(),
            lookup: None,
            heartbeat: boolean_default("heartbeat"),
            max_run_seconds: seconds_default("max_run"),
            lock_timeout_seconds: seconds_default("lock_timeout"),
            defer_margin_seconds: DEFAULT_DEFER_MARGIN_SECONDS,
            store_result: boolean_default("store_result"),
            max_takeovers: None,
        }
    }
}

impl JobOptions {
    /// Checks every value.
    ///
    /// Errors: [`Error::Config`] naming `job` and the option: a lease outside
    /// [`MIN_LEASE_SECONDS`]..=[`MAX_LEASE_SECONDS`], a max_run, lock timeout or defer
    /// margin that is not a finite number of seconds in range, an empty lookup label.
    pub fn validate(&self, job: &str) -> Result<()> {
        let bad = |what: &str, value: f64, rule: &str| {
            Err(Error::Config(format!(
                "{job}: {what} must be {rule}, got {value}"
            )))
        };
        if !(self.lease_seconds >= MIN_LEASE_SECONDS && self.lease_seconds <= MAX_LEASE_SECONDS) {
            return bad(
                "lease",
                self.lease_seconds,
                &format!(
                    "at least {MIN_LEASE_SECONDS} s (a shorter lease cannot be renewed in time) \
                     and at most {MAX_LEASE_SECONDS} s"
                ),
            );
        }
        if !(self.max_run_seconds > 0.0 && self.max_run_seconds <= MAX_LEASE_SECONDS) {
            return bad(
                "max_run",
                self.max_run_seconds,
                &format!("a positive number of seconds up to {MAX_LEASE_SECONDS}"),
            );
        }
        if !(self.lock_timeout_seconds > 0.0
            && self.lock_timeout_seconds <= crate::config::MAX_PG_TIMEOUT_SECONDS)
        {
            return bad(
                "lock_timeout",
                self.lock_timeout_seconds,
                &format!(
                    "a positive number of seconds up to {}",
                    crate::config::MAX_PG_TIMEOUT_SECONDS
                ),
            );
        }
        if !(self.defer_margin_seconds >= 0.0 && self.defer_margin_seconds <= MAX_LEASE_SECONDS) {
            return bad(
                "defer_margin",
                self.defer_margin_seconds,
                &format!("a number of seconds from 0 to {MAX_LEASE_SECONDS}"),
            );
        }
        if self.lookup.as_deref() == Some("") {
            return Err(Error::Config(format!(
                "{job}: the lookup's label must not be empty"
            )));
        }
        Ok(())
    }
}
