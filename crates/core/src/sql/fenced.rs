//! The fenced changes, which only the current claim holder may make: completion
//! ([`COMPLETE_SQL`], [`COMPLETE_ASYNCHRONOUSLY_SQL`]), release, hold, give-up, expire
//! and the heartbeat's renewal.

/// The completion statement, with `$from` (a `FROM` clause or nothing) before its
/// `WHERE`: [`COMPLETE_SQL`] and [`COMPLETE_ASYNCHRONOUSLY_SQL`] differ only there.
macro_rules! completion {
    ($from:literal) => {
        concat!(
            "UPDATE idempotent_job_records SET status = 'completed', \
             completed_at = CASE WHEN status = 'completed' THEN completed_at ELSE clock_timestamp() END, \
             result = $4::text::jsonb, result_state = $5::text, updated_at = now() ",
            $from,
            "WHERE job_type = $1 AND operation_key = $2 \
             AND claim_token = $3 AND status IN ('claimed', 'completed') \
             RETURNING (SELECT pg_notify(",
            notify_channel!(),
            ", '') WHERE $5::text IS NOT NULL) IS NULL AS notified"
        )
    };
}

// The fenced changes: only the current claim holder may make them. Each has the same
// guard (the record is still `claimed` under the caller's token) and parameters $1
// job_type, $2 operation_key, $3 claim_token, then the change's own. Completion,
// release, hold and give-up are idempotent for their own token: a repeat (the first
// answer was lost to an interrupt or a dead connection) succeeds and changes nothing.
// Expire and renew only move the lease, so a repeat is harmless too: every fenced
// change is safe to send again.

/// Mark the claim completed (the effect is done) with the body's stored result ($4 JSON
/// text or NULL, $5 `result_state` or NULL); `completed_at` is the statement's time
/// (`clock_timestamp()`). A completion with a store request also wakes the callers
/// waiting for it (`pg_notify` on the record's channel, sent at commit); a plain
/// completion notifies nobody. A repeat for the same token succeeds and changes nothing.
pub const COMPLETE_SQL: &str = completion!("");

/// [`COMPLETE_SQL`], committed with `synchronous_commit = off` (the
/// `asynchronous_completion` setting; never inside a transaction).
pub const COMPLETE_ASYNCHRONOUSLY_SQL: &str =
    completion!("FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit ");

/// Give the claim back after the job raised ($4: error text); wakes waiting callers
/// (they may claim and run now).
pub const RELEASE_SQL: &str = concat!(
    "UPDATE idempotent_job_records SET status = 'released', \
         released_at = CASE WHEN status = 'released' THEN released_at ELSE now() END, \
         last_error = $4, updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
         AND claim_token = $3 AND status IN ('claimed', 'released') \
         RETURNING (SELECT pg_notify(",
    notify_channel!(),
    ", '')) IS NULL AS notified"
);

/// `:hold` policy: keep the operation from running until a person resolves it. $4:
/// why, when not the policy (the reclaim budget): stored in `last_error`; NULL keeps it.
pub const HOLD_SQL: &str = "UPDATE idempotent_job_records SET status = 'held', \
     held_at = CASE WHEN status = 'held' THEN held_at ELSE now() END, \
     last_error = coalesce($4::text, last_error), updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
     AND claim_token = $3 AND status IN ('claimed', 'held')";

/// `:skip` policy: give the operation up.
pub const GIVE_UP_SQL: &str = "UPDATE idempotent_job_records SET status = 'given_up', \
     given_up_at = CASE WHEN status = 'given_up' THEN given_up_at ELSE now() END, \
     updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
     AND claim_token = $3 AND status IN ('claimed', 'given_up')";

/// End the lease now ($4: error text), so the next delivery treats the claim as stale.
pub const EXPIRE_SQL: &str =
    "UPDATE idempotent_job_records SET lease_expires_at = now(), last_error = $4, \
     updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
     AND claim_token = $3 AND status = 'claimed'";

/// Heartbeat: renew the lease for another `lease_seconds` from now.
pub const RENEW_SQL: &str = "UPDATE idempotent_job_records \
     SET lease_expires_at = now() + make_interval(secs => lease_seconds), \
     heartbeat_at = now(), updated_at = now() WHERE job_type = $1 \
     AND operation_key = $2 AND claim_token = $3 AND status = 'claimed'";
