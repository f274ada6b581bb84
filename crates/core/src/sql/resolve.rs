//! Settling a held or given-up operation: the rule of a stored job
//! (`holds_stored_job!`), the resolve's change (`resolve_update!`, which the record's
//! `RESOLVE_SQL` answers the record after) and [`NO_STORED_JOB_SQL`].

/// Whether a record holds a stored job (a job class or arguments: what a rerun re-sends,
/// written by the takeover a hold or a give-up follows: [`CLAIM_SQL`](super::claim::CLAIM_SQL)), as an SQL
/// condition: the one statement of the rule, read by the resolve's change, by
/// [`NO_STORED_JOB_SQL`] and by the record's `stored_job` field (`record::FIND_SQL`, what
/// both bindings show).
macro_rules! holds_stored_job {
    () => {
        "(job_class IS NOT NULL OR args IS NOT NULL)"
    };
}

/// The change of `record::RESOLVE_SQL` (which answers the record after it, with the
/// record's own select list): settle a held (or given-up) operation. $3 `done`: mark it
/// completed; `rerun`: mark it released so the re-sent delivery claims it as a retry.
/// The one test of which statuses settle is its `WHERE`: no row when the operation was
/// not held or given up when the update met it. A rerun needs the stored job
/// ([`holds_stored_job!`]); a record without one is not settled by a rerun, and
/// [`NO_STORED_JOB_SQL`] tells that case apart. Parameters: $1 job_type, $2 operation_key,
/// $3 resolution. A macro so the record's statement can `concat!` it.
macro_rules! resolve_update {
    () => {
        concat!(
            r#"
WITH settled AS (
UPDATE idempotent_job_records
   SET status = CASE WHEN $3 = 'done' THEN 'completed' ELSE 'released' END,
       completed_at = CASE WHEN $3 = 'done' THEN now() ELSE completed_at END,
       released_at = CASE WHEN $3 = 'done' THEN released_at ELSE now() END,
       resolution = $3, resolved_at = now(), updated_at = now()
 WHERE job_type = $1 AND operation_key = $2 AND status IN ('held', 'given_up')
   AND ($3 = 'done' OR "#,
            holds_stored_job!(),
            r#")
RETURNING *)
"#
        )
    };
}

/// Whether a held or given-up operation has no stored job (`holds_stored_job!`), so
/// `record::RESOLVE_SQL` cannot rerun it: read only after a rerun settled nothing, for
/// its error. Returns a row when so. Parameters: $1 job_type, $2 operation_key.
pub const NO_STORED_JOB_SQL: &str = concat!(
    r#"
SELECT status
  FROM idempotent_job_records
 WHERE job_type = $1 AND operation_key = $2 AND status IN ('held', 'given_up')
   AND NOT "#,
    holds_stored_job!()
);
