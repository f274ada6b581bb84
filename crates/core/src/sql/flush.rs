//! The repeat bookkeeping's batch statements ([`FLUSH_SQL`], [`FLUSH_AWAITING_SQL`]),
//! built from the shared CTEs `flush_batch!`, `flush_update!` and `flush_locked!`.

/// The batch statements' CTEs `k` (the batch) and `b` (its records' rows that no other
/// transaction holds, locked, each with its operation's JSON object as a record: the
/// columns of [`FLUSH_SQL`]'s $3, then `$extra`).
macro_rules! flush_batch {
    ($extra:literal) => {
        concat!(
            r#"
WITH k AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS k(job_type, operation_key, doc)),
b AS MATERIALIZED (
    SELECT r.job_type, r.operation_key, d.*
      FROM k
      JOIN idempotent_job_records AS r
        ON r.job_type = k.job_type AND r.operation_key = k.operation_key,
           jsonb_to_record(k.doc) AS d(dups int, mismatches int, last_mismatch bool,
                                       last_at timestamptz, times timestamptz[],
                                       classes text[], facts jsonb"#,
            $extra,
            r#")
     ORDER BY r.job_type, r.operation_key
       FOR NO KEY UPDATE OF r SKIP LOCKED),"#
        )
    };
}

/// The batch statements' update of each row of `b` (`written`), appending `$facts` (an
/// expression: the `repeat_facts` entries to append) and reading `$from` (more of its
/// FROM list, after `b`).
macro_rules! flush_update {
    ($facts:literal, $from:literal) => {
        concat!(
            r#"
written AS (
UPDATE idempotent_job_records AS r
   SET duplicates = least(r.duplicates::int8 + b.dups, 2147483647)::int, -- saturates: never 22003
       last_duplicate_at = CASE WHEN b.dups > 0 THEN greatest(r.last_duplicate_at, b.last_at)
                                ELSE r.last_duplicate_at END,
       mismatches = least(r.mismatches::int8 + b.mismatches, 2147483647)::int,
       last_mismatch = CASE WHEN b.dups > 0 THEN b.last_mismatch ELSE r.last_mismatch END,
       repeat_times = CASE
           WHEN cardinality(b.times) = 0 THEN r.repeat_times
           WHEN cardinality(r.repeat_times) = 0
             OR b.times[1] >= r.repeat_times[cardinality(r.repeat_times)]
           THEN (r.repeat_times || b.times)[greatest(1, cardinality(r.repeat_times)
                                                      + cardinality(b.times) - "#,
            repeats_kept!(),
            r#" + 1):]
           ELSE ARRAY(SELECT t FROM (SELECT t FROM unnest(r.repeat_times || b.times) AS t
                                      ORDER BY t DESC LIMIT "#,
            repeats_kept!(),
            r#") AS kept ORDER BY t) END,
       job_classes = CASE
           WHEN b.classes <@ r.job_classes THEN r.job_classes
           ELSE r.job_classes || ARRAY(SELECT DISTINCT c FROM unnest(b.classes) AS c
                                        WHERE c <> ALL (r.job_classes)) END,
       repeat_facts = CASE
           WHEN jsonb_array_length(r.repeat_facts) + jsonb_array_length("#,
            $facts,
            r#") <= "#,
            repeats_kept!(),
            r#"
           THEN r.repeat_facts || "#,
            $facts,
            r#"
           ELSE jsonb_path_query_array(r.repeat_facts || "#,
            $facts,
            r#", '$[last - "#,
            repeats_kept!(),
            r#" + 1 to last]') END,
       updated_at = greatest(r.updated_at, b.last_at)
  FROM b"#,
            $from,
            r#", (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
 WHERE r.job_type = b.job_type AND r.operation_key = b.operation_key)"#
        )
    };
}

/// The batch statements' operations left out because another transaction held their row
/// (`$columns`: more columns after `k.job_type, k.operation_key`).
macro_rules! flush_locked {
    ($columns:literal) => {
        concat!(
            r#"
SELECT k.job_type, k.operation_key"#,
            $columns,
            r#"
  FROM k
 WHERE (SELECT count(*) FROM b) < (SELECT count(*) FROM k)
   AND NOT EXISTS (SELECT 1 FROM b
                    WHERE b.job_type = k.job_type AND b.operation_key = k.operation_key)
   AND EXISTS (SELECT 1 FROM idempotent_job_records AS r
                WHERE r.job_type = k.job_type AND r.operation_key = k.operation_key)"#
        )
    };
}

/// Applies one batch of repeats: $1 job types, $2 operation keys, $3 one JSON
/// object per operation (same order): `dups` (duplicates to add), `mismatches`,
/// `last_mismatch`, `last_at` (latest duplicate's database time, or null), `times`
/// (duplicate times to append to `repeat_times`, in order), `classes`, `facts` (entries to
/// append to `repeat_facts`). Keeps the last `repeats_kept!()` times and facts. Each operation's
/// row is found through the primary key (arrays, so the planner expects a few rows,
/// never a scan of the table). Committed asynchronously (`synchronous_commit = off`
/// for this statement's transaction).
///
/// **Never waits for a row lock.** `b` locks the batch's rows with `SKIP LOCKED`: a row
/// another transaction holds right now (a job's open transaction that claimed it, in the
/// ActiveRecord or native transaction modes; another process's batch; a claim statement)
/// is left out, not waited for, and the update touches only rows `b` returned. So a batch
/// never waits on an application's transaction, and batches of many processes never
/// wait on each other in a cycle (no deadlock, SQLSTATE 40P01, is possible). The
/// statement returns the operations it left out because their row was locked (their
/// record exists, so `b` skipped it; looked for only when `b` has fewer rows than the
/// batch, a one-time filter, so a batch that locked every row pays two counts of its
/// CTEs): the caller keeps them queued and sends them again later (the repeat bookkeeping's writer). An operation with no record (purged)
/// is neither written nor returned.
///
/// A batch with entries that wait for a transaction's commit is sent as
/// [`FLUSH_AWAITING_SQL`] instead (the same update, plus those entries): this one stays
/// as it was for every other batch (measured: docs/design.md, "Repeat bookkeeping").
///
/// **Cheap per row.** The usual repeat appends: its times come after the record's last
/// one, its classes are known already, and the arrays are under the bound. Those cases
/// are plain concatenations and slices (`repeat_facts` trimmed with a jsonpath slice);
/// only times older than the record's last one (another process's batch written first)
/// are merged by sorting. Measured (docs/benchmarks.md, "Repeat bookkeeping per row"):
/// 73 → 58 µs a row in batches of 3, 30 → 22 µs in batches of 60, 62 → 32 µs for
/// records at the bound, against the statement before (lock CTE, hash join, and an
/// unnest/sort/`jsonb_agg` of every array for every row); same WAL.
pub const FLUSH_SQL: &str = concat!(
    flush_batch!(""),
    flush_update!("b.facts", ""),
    flush_locked!("")
);

/// [`FLUSH_SQL`] for a batch with `repeat_facts` entries that wait for their transaction's
/// commit (Ruby's ActiveRecord mode queues a repeat's entry before ActiveRecord commits:
/// `bookkeeping::Repeat::xid`): the same update, its $3 objects with one more field,
/// `awaiting` (absent or null when the operation has none): `{"xid": "<transaction id>",
/// "entry": {…}}` objects, the `xid` being [`CLAIM_SQL`](super::claim::CLAIM_SQL)'s.
///
/// `w` asks `pg_xact_status` of each, once, after `b` locked the row (only of an id older
/// than this statement's own, `pg_current_xact_id()`, which the update assigns anyway: an
/// id not assigned on this server yet would make `pg_xact_status` raise and the whole
/// batch fail). An entry whose transaction committed is appended (after the operation's
/// `facts`); the others are returned, with their position in `awaiting` (from 1) and
/// their status: `in progress` (the caller keeps them queued), `aborted` (the claim's
/// counting was rolled back: the caller lets them go), or NULL (an id PostgreSQL cannot
/// answer for: not yet assigned on this server, e.g. after a failover, or older than its
/// commit log: the caller drops and counts them).
///
/// Returns rows `(job_type, operation_key, awaiting, status)`: a locked operation with
/// `awaiting` and `status` NULL (as [`FLUSH_SQL`] returns it), an entry not written with
/// both set. Needs PostgreSQL 13+ (`xid8`).
pub const FLUSH_AWAITING_SQL: &str = concat!(
    flush_batch!(", awaiting jsonb"),
    r#"
w AS MATERIALIZED (
    SELECT b.job_type, b.operation_key, e.n, e.a -> 'entry' AS entry,
           CASE WHEN x.xid < pg_current_xact_id() THEN pg_xact_status(x.xid) END AS status
      FROM b, jsonb_array_elements(b.awaiting) WITH ORDINALITY AS e(a, n),
           LATERAL (SELECT (e.a ->> 'xid')::xid8 AS xid) AS x
     WHERE b.awaiting IS NOT NULL),"#,
    flush_update!(
        "f.facts",
        r#"
       CROSS JOIN LATERAL (
           SELECT CASE WHEN b.awaiting IS NULL THEN b.facts
                       ELSE b.facts || coalesce(
                           (SELECT jsonb_agg(w.entry ORDER BY w.n) FROM w
                             WHERE w.job_type = b.job_type AND w.operation_key = b.operation_key
                               AND w.status = 'committed'), '[]') END AS facts) AS f"#
    ),
    flush_locked!(", NULL::int8 AS awaiting, NULL::text AS status"),
    r#"
UNION ALL
SELECT w.job_type, w.operation_key, w.n, w.status
  FROM w
 WHERE w.status IS DISTINCT FROM 'committed'"#
);
