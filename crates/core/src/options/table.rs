//! The table of job options ([`JOB_OPTIONS`]): each option's name, kind ([`Kind`]),
//! default ([`Default`]) and limits, the policies' names, and [`find`].

/// Shortest lease accepted, in seconds: below it a heartbeat cannot renew in time (one
/// statement round trip and a thread wake-up) and every delivery looks stale.
pub const MIN_LEASE_SECONDS: f64 = 0.25;
/// Longest duration accepted for a job option or a setting, in seconds (ten years).
pub const MAX_SECONDS: f64 = MAX_LEASE_SECONDS;

/// PostgreSQL's limit for `statement_timeout` and `lock_timeout` (INT_MAX ms), in seconds
/// (re-exported as `config::MAX_PG_TIMEOUT_SECONDS`).
pub const MAX_PG_TIMEOUT_SECONDS: f64 = 2_147_483.0;

/// Longest lease accepted, in seconds (ten years; PostgreSQL intervals overflow far
/// beyond that; re-exported as `config::MAX_LEASE_SECONDS`).
pub const MAX_LEASE_SECONDS: f64 = 315_360_000.0;

/// What values an option takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// The operation key declaration (a parameter name, an argument index, a dotted
    /// path or a list of those): checked by the binding against the job's method.
    Key,
    /// A non-empty string (the job type stored in the record).
    Text,
    /// A number of seconds: above `min` (or equal to it when `min_inclusive`), at most
    /// `max`; `why_min` explains a minimum above zero.
    Seconds {
        /// The lower bound, in seconds.
        min: f64,
        /// `min` itself is accepted.
        min_inclusive: bool,
        /// Why the minimum (`""` for none above zero).
        why_min: &'static str,
        /// The upper bound, in seconds (inclusive).
        max: f64,
        /// Why the maximum.
        why_max: &'static str,
    },
    /// One of `allowed` (a symbol or a string in the host language).
    Choice {
        /// The values' names.
        allowed: &'static [&'static str],
    },
    /// `true` or `false` (never a string: `"false"` is refused).
    Boolean,
    /// Off (`false` or unset), `true` (meaning `on`), or one of `allowed` by name.
    Flavour {
        /// The flavour `true` stands for.
        on: &'static str,
        /// The flavours' names.
        allowed: &'static [&'static str],
    },
    /// A method of the job by name, or a callable: checked by the binding.
    Method,
    /// A whole number from `min` to `max` (a count, never a string or a fraction);
    /// `why_max` explains the maximum ("" for none).
    Count {
        /// The smallest count (inclusive).
        min: i64,
        /// The largest count (inclusive).
        max: i64,
        /// Why the maximum (`""` for none).
        why_max: &'static str,
    },
}

/// A default value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// Not set: the option is off or absent.
    None,
    /// The job's name (its class name).
    JobName,
    /// A number of seconds.
    Seconds(f64),
    /// A choice's name.
    Choice(&'static str),
    /// A boolean.
    Boolean(bool),
}

/// One job option.
#[derive(Debug, Clone, Copy)]
pub struct JobOption {
    /// The option's name without a door's prefix (`lease`, `on_stale`).
    pub name: &'static str,
    /// What values it takes.
    pub kind: Kind,
    /// Its value when neither the job nor the settings set it.
    pub default: Default,
    /// The setting of the same meaning that gives every job its default (e.g. the
    /// `lease` setting of `IdempotentJob.configure`), if there is one.
    pub setting: Option<&'static str>,
    /// Whether a job must declare it (only the key).
    pub required: bool,
    /// One line saying what it does.
    pub doc: &'static str,
}

/// The policies for a stale claim, chosen in advance.
pub const STALE_POLICIES: &[&str] = &["reclaim", "hold", "skip"];
/// What a delivery whose payload differs from the claim's does.
pub const MISMATCH_POLICIES: &[&str] = &["log", "raise"];
/// What a producer's push of an operation already completed does (reject at enqueue).
pub const ENQUEUE_POLICIES: &[&str] = &["push", "skip_completed"];
/// The transactional flavours (`true` means native).
pub const TRANSACTIONS: &[&str] = &["native", "active_record"];

/// A positive number of seconds up to [`MAX_SECONDS`]: the rule of every duration,
/// job option or setting, PostgreSQL does not bound ([`PG_TIMEOUT`]).
pub const DURATION: Kind = Kind::Seconds {
    min: 0.0,
    min_inclusive: false,
    why_min: "",
    max: MAX_SECONDS,
    why_max: "ten years",
};

/// A positive number of seconds up to PostgreSQL's limit for `statement_timeout` and
/// `lock_timeout` ([`MAX_PG_TIMEOUT_SECONDS`]).
pub const PG_TIMEOUT: Kind = Kind::Seconds {
    min: 0.0,
    min_inclusive: false,
    why_min: "",
    max: MAX_PG_TIMEOUT_SECONDS,
    why_max: "PostgreSQL's limit",
};

/// Every job option, in the order messages list them.
pub const JOB_OPTIONS: &[JobOption] = &[
    JobOption {
        name: "key",
        kind: Kind::Key,
        default: Default::None,
        setting: None,
        required: true,
        doc: "the operation key: a parameter name, an argument index, a dotted path, or a list of those",
    },
    JobOption {
        name: "scope",
        kind: Kind::Text,
        default: Default::JobName,
        setting: None,
        required: false,
        doc: "the job type stored in the record (default the job's class name)",
    },
    JobOption {
        name: "lease",
        kind: Kind::Seconds {
            min: MIN_LEASE_SECONDS,
            min_inclusive: true,
            why_min: "a shorter lease cannot be renewed in time",
            max: MAX_SECONDS,
            why_max: "ten years",
        },
        default: Default::Seconds(300.0),
        setting: Some("lease"),
        required: false,
        doc: "seconds a claim is held before it is stale (renewed by the heartbeat)",
    },
    JobOption {
        name: "on_stale",
        kind: Kind::Choice {
            allowed: STALE_POLICIES,
        },
        default: Default::Choice("reclaim"),
        setting: Some("on_stale"),
        required: false,
        doc: "a stale claim: reclaim (run again), hold (for a person), skip (give up)",
    },
    JobOption {
        name: "on_mismatch",
        kind: Kind::Choice {
            allowed: MISMATCH_POLICIES,
        },
        default: Default::Choice("log"),
        setting: Some("on_mismatch"),
        required: false,
        doc: "a delivery whose payload differs from the claim's: log it, or raise",
    },
    JobOption {
        name: "lookup",
        kind: Kind::Method,
        default: Default::None,
        setting: None,
        required: false,
        doc: "a method (or callable) asked whether a stale claim's effect happened: done, not_done, unknown",
    },
    JobOption {
        name: "heartbeat",
        kind: Kind::Boolean,
        default: Default::Boolean(true),
        setting: Some("heartbeat"),
        required: false,
        doc: "renew the lease while the body runs",
    },
    JobOption {
        name: "max_run",
        kind: DURATION,
        default: Default::Seconds(3600.0),
        setting: Some("max_run"),
        required: false,
        doc: "seconds after which the heartbeat stops renewing (a hung body loses its claim)",
    },
    JobOption {
        name: "transaction",
        kind: Kind::Flavour {
            on: "native",
            allowed: TRANSACTIONS,
        },
        default: Default::None,
        setting: None,
        required: false,
        doc: "commit the body's statements with the claim: true (native) or active_record",
    },
    JobOption {
        name: "lock_timeout",
        kind: PG_TIMEOUT,
        default: Default::Seconds(5.0),
        setting: Some("lock_timeout"),
        required: false,
        doc: "seconds a transactional claim waits for another delivery's transaction",
    },
    JobOption {
        name: "store_result",
        kind: Kind::Boolean,
        default: Default::Boolean(false),
        setting: None,
        required: false,
        doc: "store the body's return value as JSON with the completion, so a repeat replays it",
    },
    JobOption {
        name: "on_enqueue",
        kind: Kind::Choice {
            allowed: ENQUEUE_POLICIES,
        },
        default: Default::Choice("push"),
        setting: None,
        required: false,
        doc: "a producer's push of a completed operation: push it, or skip_completed (push nothing)",
    },
    JobOption {
        name: "max_takeovers",
        kind: Kind::Count {
            min: 0,
            max: MAX_TAKEOVERS,
            why_max: "",
        },
        default: Default::None,
        setting: None,
        required: false,
        doc: "stale takeovers of one operation before the next is held for a person (after its lookup) instead of reclaimed",
    },
];

/// Largest `max_takeovers` accepted (the record counts takeovers in a 32-bit integer).
pub const MAX_TAKEOVERS: i64 = i32::MAX as i64 - 1;

/// The option named `name` (without a prefix).
pub fn find(name: &str) -> Option<&'static JobOption> {
    JOB_OPTIONS.iter().find(|o| o.name == name)
}
