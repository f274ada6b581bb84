//! The retention's purge: one batch of finished records deleted ([`PURGE_SQL`]), and the
//! planner settings sent around it.

/// Delete one batch of finished records (completed or given up) that finished more
/// than $1 seconds ago, at most $2 of them, taken in the order (first claim time, job
/// type, operation key) of the `first_claimed_at` index (V10) after the key ($3 first
/// claim time, $4 job type, $5 operation key; all NULL for the first batch): keyset
/// pagination, so a batch starts where the previous one ended and never reads the
/// index entries of the records earlier batches deleted (dead until VACUUM). A record
/// finishes after its first claim, so every record due is among those first claimed
/// before the cutoff; the walk stops there and skips the unfinished and recently
/// finished records it passes (each read once per purge). Rows locked by a claim in
/// progress are skipped, never waited for; held and live or stale claims are never
/// touched. Returns one row: deleted, picked (rows the batch locked), and the last
/// picked key (NULLs when it picked none), the next batch's $3..$5.
///
/// The index's columns never change after the first claim, so a completion is a HOT
/// update (no index entry written); the retention index V9 built on the finish time
/// made every completion write index entries.
///
/// The batch is deleted by primary key, not by row address (`ctid`): a row another
/// transaction updated after this statement's snapshot (a duplicate's count, say) is
/// locked in its new version, whose address the statement's snapshot cannot see, so it
/// would be skipped and the batch come back short; the key follows the update and
/// deletes it. The keys come as two arrays (`unnest`), which the planner always joins
/// by probing the primary key: a subquery joined instead could be hashed against a scan
/// of the whole table once per batch (what made purge time grow with the square of the
/// table when statistics said the batch was large).
pub const PURGE_SQL: &str = r#"
WITH doomed AS MATERIALIZED (
  SELECT job_type, operation_key, first_claimed_at
    FROM idempotent_job_records
   WHERE first_claimed_at < now() - make_interval(secs => $1)
     AND (first_claimed_at, job_type, operation_key)
         > (coalesce($3, '-infinity'), coalesce($4, ''), coalesce($5, ''))
     AND status IN ('completed', 'given_up')
     AND coalesce(completed_at, given_up_at) < now() - make_interval(secs => $1)
   ORDER BY first_claimed_at, job_type, operation_key
   LIMIT $2
     FOR UPDATE SKIP LOCKED),
gone AS (
  DELETE FROM idempotent_job_records r
   USING unnest(ARRAY(SELECT job_type FROM doomed ORDER BY first_claimed_at, job_type, operation_key),
                ARRAY(SELECT operation_key FROM doomed ORDER BY first_claimed_at, job_type, operation_key))
         AS d (job_type, operation_key)
   WHERE r.job_type = d.job_type AND r.operation_key = d.operation_key
  RETURNING 1)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM doomed) AS picked,
       last.first_claimed_at, last.job_type, last.operation_key
  FROM (SELECT) AS one
  LEFT JOIN (SELECT first_claimed_at, job_type, operation_key
               FROM doomed
              ORDER BY first_claimed_at DESC, job_type DESC, operation_key DESC
              LIMIT 1) AS last ON true"#;

/// Sent before [`PURGE_SQL`]: its batch must walk the `first_claimed_at` index in
/// order. Statistics that expect few due records (none yet, or taken before a bulk
/// load) make a bitmap scan and a sort look cheaper, and that reads every due record's
/// entry in every batch (a purge's time growing with the square of the records it
/// deletes); with sorting priced out the ordered index walk is the plan. Pricing it out
/// lifts the plan's estimated cost past `jit_above_cost`, and JIT compilation then cost
/// ≈260 ms per 50-record batch (bin/stress's purge stalled): JIT is off for it too.
pub const PURGE_PLAN_SQL: &str = "SET enable_sort = off; SET jit = off";

/// Sent after [`PURGE_SQL`] (whatever it answered): the connection's own settings again.
pub const PURGE_PLAN_RESET_SQL: &str = "RESET enable_sort; RESET jit";
