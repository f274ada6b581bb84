//! A waiter's statements: the record's LISTEN channel ([`CHANNEL_SQL`]) and the look
//! at the claim it waits for ([`WAIT_SQL`]).

/// The record's LISTEN channel name (`notify_channel!`). Parameters: $1 job_type,
/// $2 operation_key.
pub const CHANNEL_SQL: &str = concat!(
    "SELECT ",
    notify_channel!(),
    " FROM (SELECT $1::text AS job_type, $2::text AS operation_key) AS k"
);

/// A waiter's look at the record: whether a live claim still holds it, and (for an
/// answer when the wait ends) the holder's delivery id, attempt, duplicate count and
/// remaining lease. Reads only. Parameters: $1 job_type, $2 operation_key.
pub const WAIT_SQL: &str = r#"
SELECT status = 'claimed' AND lease_expires_at > now() AS live, jid, attempts, duplicates,
       (EXTRACT(EPOCH FROM lease_expires_at) - EXTRACT(EPOCH FROM now()))::float8 AS lease_remaining
  FROM idempotent_job_records
 WHERE job_type = $1 AND operation_key = $2"#;
