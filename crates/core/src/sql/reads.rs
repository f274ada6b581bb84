//! The operators' read-only lists and metrics (`report`, the repeats report): held,
//! given-up, searched, taken-over and stale records, the job types, the repeated
//! operations ([`REPEATS_SQL`]) and `/metrics` ([`METRICS_SQL`]).

/// Held operations, oldest first. Parameters: $1 job_type or NULL for all, $2 limit.
/// Walks the index of records ever held (`held_at IS NOT NULL`, V10), filtering the
/// status: a record resolved since keeps its `held_at`.
pub const HELD_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE held_at IS NOT NULL AND status = 'held' AND ($1::text IS NULL OR job_type = $1)
 ORDER BY held_at, job_type, operation_key
 LIMIT $2"#;

/// Operations delivered more than once since $1 (optionally of job type $2), for the
/// repeats report: their counts, first claim and repeat times, delivering classes, the
/// last claiming delivery's id, the completion time, the first claim's facts and each
/// repeat's recorded facts (the last `repeats_kept!()`: bounded per operation).
pub const REPEATS_SQL: &str = r#"
SELECT job_type, operation_key, status, attempts, takeovers, duplicates, mismatches,
       first_claimed_at, repeat_times, job_classes, jid, completed_at,
       first_facts::text AS first_facts, repeat_facts::text AS repeat_facts
  FROM idempotent_job_records
 WHERE cardinality(repeat_times) > 0
   AND repeat_times[cardinality(repeat_times)] >= $1
   AND ($2::text IS NULL OR job_type = $2)
 ORDER BY job_type, first_claimed_at"#;

/// Operations given up by the `:skip` policy, most recent first.
/// Parameters: $1 job_type or NULL for all, $2 limit.
pub const GIVEN_UP_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE status = 'given_up' AND ($1::text IS NULL OR job_type = $1)
 ORDER BY given_up_at DESC, job_type, operation_key
 LIMIT $2"#;

/// Records of one job type, most recently changed first (the primary key's leading
/// column narrows the scan). Parameters: $1 job_type, $2 operation-key prefix or NULL,
/// $3 status or NULL, $4 limit.
pub const SEARCH_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE job_type = $1
   AND ($2::text IS NULL OR starts_with(operation_key, $2))
   AND ($3::text IS NULL OR status = $3)
 ORDER BY updated_at DESC, operation_key
 LIMIT $4"#;

/// Records whose latest claim took over an expired lease at or after $1, newest first:
/// each is a claim its previous holder lost. Parameters: $1 since, $2 limit.
pub const TAKEOVERS_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE last_claim = 'takeover' AND claimed_at >= $1
 ORDER BY claimed_at DESC, job_type, operation_key
 LIMIT $2"#;

/// Claims whose lease has run out (by the database clock) and that no delivery has
/// taken over yet: their holder may have died; the next delivery of each is a
/// takeover. Longest expired first. Parameters: $1 limit.
pub const STALE_CLAIMS_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE status = 'claimed' AND lease_expires_at <= now()
 ORDER BY lease_expires_at, job_type, operation_key
 LIMIT $1"#;

/// The distinct job types, in order, by a loose scan of the primary key (one index
/// probe per job type, however many records each has). Parameters: $1 limit.
pub const JOB_TYPES_SQL: &str = r#"
WITH RECURSIVE types(job_type) AS (
    (SELECT job_type FROM idempotent_job_records ORDER BY job_type LIMIT 1)
    UNION ALL
    SELECT (SELECT r.job_type FROM idempotent_job_records r
             WHERE r.job_type > types.job_type ORDER BY r.job_type LIMIT 1)
      FROM types
     WHERE types.job_type IS NOT NULL)
SELECT job_type FROM types WHERE job_type IS NOT NULL LIMIT $1"#;

/// What `/metrics` reports per job type, read from the table in one statement (so
/// every process answers the same), aggregated over the whole table: records by
/// status; live and stale claims; the age in seconds of the oldest held operation (0
/// when none is held or its `held_at` is in the future; computed from epochs, so a
/// `held_at` edited to `-infinity` is an infinite age, never PostgreSQL's 22008
/// "cannot subtract infinite timestamps" breaking every scrape); the held operations the reclaim budget held (their
/// `last_error` begins with [`RECLAIM_BUDGET_SPENT`](super::fragments::RECLAIM_BUDGET_SPENT)); the repeated deliveries recorded in the last hour (each
/// record keeps its last 20 repeat times, so an operation counts at most 20) and the
/// operations they belong to; and the purge backlog: finished records (completed or
/// given up) that finished more than $1 seconds ago, the retention — what
/// [`PURGE_SQL`](super::purge::PURGE_SQL) would delete with the same age. Parameters: $1
/// retention in seconds.
pub const METRICS_SQL: &str = concat!(
    r#"
SELECT job_type,
       count(*) FILTER (WHERE status = 'claimed') AS claimed,
       count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status = 'released') AS released,
       count(*) FILTER (WHERE status = 'held') AS held,
       count(*) FILTER (WHERE status = 'given_up') AS given_up,
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at > now()) AS live_claims,
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at <= now()) AS stale_claims,
       coalesce(greatest(extract(epoch FROM now())
                         - extract(epoch FROM min(held_at) FILTER (WHERE status = 'held')), 0),
                0)::float8
           AS oldest_held_seconds,
       count(*) FILTER (WHERE status = 'held' AND starts_with(last_error, '"#,
    reclaim_budget_spent!(),
    r#"'))
           AS held_by_reclaim_budget,
       coalesce(sum((SELECT count(*) FROM unnest(repeat_times) AS t(at)
                      WHERE t.at >= now() - interval '1 hour')), 0)::int8 AS repeats_last_hour,
       count(*) FILTER (WHERE repeat_times[cardinality(repeat_times)] >= now() - interval '1 hour')
           AS repeated_operations_last_hour,
       count(*) FILTER (WHERE status IN ('completed', 'given_up')
                          AND coalesce(completed_at, given_up_at) < now() - make_interval(secs => $1))
           AS purge_backlog
  FROM idempotent_job_records
 GROUP BY job_type
 ORDER BY job_type"#
);
