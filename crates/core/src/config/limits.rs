//! The limits and defaults every binding reads from the core: PostgreSQL's timeout
//! limit, the longest lease, result sizes, the repeats kept, the retention default,
//! the `compatibility` values.

/// Default of `enqueue_check_timeout` ([`Config::enqueue_check_timeout`](super::Config::enqueue_check_timeout)), seconds.
pub const DEFAULT_ENQUEUE_CHECK_TIMEOUT_SECONDS: f64 = 0.5;

/// The `compatibility` values ([`Config::compatibility`](super::Config::compatibility)): plain PostgreSQL (default).
pub const COMPATIBILITY_POSTGRESQL: &str = "postgresql";
/// The `compatibility` values: a distributed or pooled PostgreSQL-compatible server.
pub const COMPATIBILITY_DISTRIBUTED: &str = "distributed";

/// PostgreSQL's limit for `statement_timeout` and `lock_timeout`, and the longest lease
/// (ten years): stated with the kinds of value that bound durations by them
/// ([`crate::options`], which the settings' rules use, so it imports nothing of
/// `config`), named here with every other limit.
pub use crate::options::{MAX_LEASE_SECONDS, MAX_PG_TIMEOUT_SECONDS};

/// Longest `job_type` + `operation_key`, in bytes (the key rules, [`crate::keys`],
/// state it; named here with every other limit).
pub use crate::keys::MAX_KEY_BYTES;

/// Default of `max_result_bytes` ([`Config::max_result_bytes`](super::Config::max_result_bytes)): 64 KiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 65_536;

/// How many repeats each record keeps the latest of (`repeat_times`, `repeat_facts`:
/// older ones are dropped, so a record stays bounded). The statements spell it with the
/// `repeats_kept!` text of the `sql` module, which this number is read from.
pub const REPEATS_KEPT: usize = digits(repeats_kept!());

/// The number a text of ASCII digits spells (a compile-time constant).
const fn digits(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "not a number");
        n = n * 10 + (bytes[i] - b'0') as usize;
        i += 1;
    }
    n
}

/// Largest `pool_size` accepted: PostgreSQL's most backends (`MAX_BACKENDS`,
/// 2^18 - 1); the pool sizes its slots and its blocking threads by it.
pub const MAX_POOL_SIZE: usize = 262_143;

/// Connections a pool sized by a queue's concurrency has beyond it
/// ([`pool_size_for`](super::pool_size_for)): the heartbeats and deferrals share the pool
/// with the running jobs.
pub const POOL_HEADROOM: usize = 5;

/// The environment variables a binding reads the database URL from when the
/// `database_url` setting is unset, in order (the first set and non-empty one;
/// [`env_database_url`](super::env_database_url)).
pub const DATABASE_URL_VARIABLES: [&str; 2] = ["IDEMPOTENT_JOB_DATABASE_URL", "DATABASE_URL"];

/// Largest `max_result_bytes` accepted: just under jsonb's limit (256 MiB).
pub const MAX_RESULT_BYTES_LIMIT: usize = 268_435_455;

/// Default `retention` setting, in seconds (30 days): how long a finished record
/// (completed or given up) is kept before a purge deletes it.
pub const DEFAULT_RETENTION_SECONDS: f64 = 2_592_000.0;
