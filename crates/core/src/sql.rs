//! Every SQL statement the core sends on the record table, one text per statement,
//! shared by every path that sends it (the native pool, a transaction, the Ruby
//! binding's ActiveRecord strategy, which asks for the text). The record's read
//! (`FIND_SQL`) and the resolve (`RESOLVE_SQL`, over `resolve_update!`'s change) are
//! generated with the record's columns in the `record` module; the schema's in `migrate`.
//!
//! Parameters are numbered as each constant's doc says; every statement on one
//! operation takes $1 job_type and $2 operation_key.

/// How many repeats a record keeps the latest of (`repeat_times`, `repeat_facts`), as
/// the statements spell it; `config::REPEATS_KEPT` is the same number for Rust.
macro_rules! repeats_kept {
    () => {
        "20"
    };
}

/// The LISTEN/NOTIFY channel of one record, as an SQL expression over its `job_type`
/// and `operation_key` columns: `idempotent_job_` and the md5 of the length-prefixed
/// pair (a valid identifier of 47 characters, whatever the key). Written once here;
/// the completion and release notify on it, a waiter listens on it ([`CHANNEL_SQL`]).
macro_rules! notify_channel {
    () => {
        "'idempotent_job_' || md5(length(job_type) || ':' || job_type || operation_key)"
    };
}

/// How the reason a hold by the reclaim budget (`max_takeovers`) stores in `last_error`
/// begins: written once here, for the protocol's text
/// (the protocol's `reclaim_budget_reason`) and [`METRICS_SQL`]'s count of such holds.
macro_rules! reclaim_budget_spent {
    () => {
        "the reclaim budget is spent"
    };
}
pub(crate) use reclaim_budget_spent;

/// How the reason a hold by the reclaim budget stores in `last_error` begins (the
/// record of a body that kept killing its worker).
pub const RECLAIM_BUDGET_SPENT: &str = reclaim_budget_spent!();

/// The columns a first claim inserts: the one list [`CLAIM_SQL`] and [`DELIVER_SQL`] share.
macro_rules! first_claim_columns {
    () => {
        "(job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at,
     args_digest, job_classes, first_facts)"
    };
}

/// The values a first claim inserts into [`first_claim_columns!`]: parameters $1–$8,
/// numbered alike in [`CLAIM_SQL`] and [`DELIVER_SQL`] ($1 job_type, $2 operation_key,
/// $3 claim_token, $4 jid, $5 lease in seconds, $6 args_digest, $7 job_class, $8 the
/// delivery's facts), so one parameter list's first eight serve both statements.
macro_rules! first_claim_values {
    () => {
        "$1, $2, 'claimed', $3, $4, $5, now() + make_interval(secs => $5),
        $6, array_remove(ARRAY[$7::text], NULL), $8::jsonb"
    };
}

/// Claim, or count a duplicate, in one statement.
///
/// * no record: insert it as `claimed` with the caller's token (a first claim);
/// * `released` (the last holder's job raised), or `claimed` with an expired lease
///   (the holder may have died): take it over with the caller's token, `attempts`+1;
/// * otherwise (`completed`, `held`, `given_up`, or `claimed` with a live lease):
///   change nothing but `duplicates`+1 and `last_duplicate_at` — unless $12 is true
///   (a copy coming back: deferred behind a live claim before, or deciding again
///   after a wait), which was counted when it first arrived and is not counted again
///   (`duplicates` and `mismatches` count copies, not their returns).
///
/// **The stored job** (`job_class`, `queue`, `args`: what `resolve(as: :rerun)`
/// re-sends) is written only by a takeover (a stale claim taken over), the one claim a
/// hold or a give-up follows (`transitions::next`): a first claim and a retry do not
/// write it (issue 31, on the V11 schema: no migration; before, every claim did, ≈67
/// bytes of WAL per first claim for a feature only held operations use). A first claim
/// keeps its job class in `job_classes` (the repeats report).
///
/// Every repeat (any delivery after the first) appends its time to `repeat_times`
/// (the last `repeats_kept!()` are kept) and its job class to `job_classes`, for the repeats report.
///
/// A delivery whose argument digest differs from the claim's is a payload mismatch:
/// it is counted in `mismatches` and flagged in `last_mismatch`; when $11 is true
/// (`idempotency_on_mismatch: :raise`) such a delivery never takes a claim over.
///
/// `jsonb` cannot hold the character U+0000: arguments whose JSON text contains the
/// escape `\u0000` are stored as `{"idempotent_job:json": "<the JSON text>"}` (a jsonb
/// string holds the escape itself), and `FIND_SQL` gives the original text back, so
/// such a job still runs and a rerun gets its arguments unchanged.
///
/// `won` in the result tells the caller whether its token is now the record's;
/// `result` and `result_state` are the stored result of a completed record (a replay:
/// see the stored results), NULL when its completion stored none. `xid` is the
/// transaction's id as text (`pg_current_xact_id_if_assigned()`, a full 64-bit id, so
/// PostgreSQL 13+; the statement always writes the row, so it is assigned): a claim made
/// inside a transaction another driver commits (Ruby's ActiveRecord mode) has its repeat's
/// `repeat_facts` entry wait for that transaction's commit ([`FLUSH_AWAITING_SQL`]'s `awaiting`).
/// Parameters: $1–$8 those of the first-claim insert (`first_claim_values!`, shared with
/// [`DELIVER_SQL`]): $1 job_type, $2 operation_key, $3 claim_token (uuid), $4 jid,
/// $5 lease in seconds (float8), $6 args_digest, $7 job_class, $8 the delivery's facts
/// (JSON object text or NULL: a first claim keeps them as `first_facts` for the repeats
/// report; a repeat's own facts are written off this path, by the bookkeeping); then
/// $9 queue, $10 arguments (JSON text; $9 and $10 are written by a takeover only),
/// $11 refuse mismatched payloads (bool), $12 a copy coming back (bool,
/// `ClaimRequest::returning`).
pub const CLAIM_SQL: &str = concat!(
    r#"
INSERT INTO idempotent_job_records AS r
    "#,
    first_claim_columns!(),
    "\nVALUES (",
    first_claim_values!(),
    r#")
ON CONFLICT (job_type, operation_key) DO UPDATE SET
    (status, claim_token, jid, attempts, takeovers, last_claim, claimed_at,
     lease_seconds, lease_expires_at, args_digest, job_class, queue, args,
     duplicates, last_duplicate_at, mismatches, last_mismatch, repeat_times, job_classes,
     updated_at) =
    (SELECT CASE WHEN d.take THEN 'claimed' ELSE r.status END,
            CASE WHEN d.take THEN excluded.claim_token ELSE r.claim_token END,
            CASE WHEN d.take THEN excluded.jid ELSE r.jid END,
            r.attempts + d.take::int,
            r.takeovers + (d.take AND r.status = 'claimed')::int,
            CASE WHEN NOT d.take THEN r.last_claim
                 WHEN r.status = 'claimed' THEN 'takeover'
                 ELSE 'retry' END,
            CASE WHEN d.take THEN now() ELSE r.claimed_at END,
            CASE WHEN d.take THEN excluded.lease_seconds ELSE r.lease_seconds END,
            CASE WHEN d.take THEN excluded.lease_expires_at ELSE r.lease_expires_at END,
            CASE WHEN d.take THEN excluded.args_digest ELSE r.args_digest END,
            -- The stored job (issue 31): written by a takeover only, the claim a hold or a
            -- give-up follows; a first claim and a retry leave it as it is.
            CASE WHEN d.takeover THEN $7::text ELSE r.job_class END,
            CASE WHEN d.takeover THEN $9::text ELSE r.queue END,
            CASE WHEN NOT d.takeover THEN r.args
                 WHEN strpos($10::text, '\u0000') > 0
                 THEN jsonb_build_object('idempotent_job:json', $10::text)
                 ELSE $10::text::jsonb END,
            r.duplicates + (NOT d.take AND NOT $12)::int,
            CASE WHEN d.take OR $12 THEN r.last_duplicate_at ELSE now() END,
            r.mismatches + (d.mismatch AND NOT $12)::int,
            d.mismatch,
            (r.repeat_times || now())[greatest(1, cardinality(r.repeat_times) - ("#,
    repeats_kept!(),
    r#" - 2)):],
            CASE WHEN $7::text IS NULL OR $7::text = ANY (r.job_classes)
                 THEN r.job_classes ELSE r.job_classes || $7::text END,
            now()
       FROM (SELECT t.mismatch, t.take, t.take AND r.status = 'claimed' AS takeover
               FROM (SELECT m.mismatch,
                            NOT (m.mismatch AND $11)
                            AND (r.status = 'released'
                                 OR (r.status = 'claimed' AND r.lease_expires_at <= now()))
                            AS take
                       FROM (SELECT r.args_digest IS NOT NULL
                                    AND r.args_digest <> excluded.args_digest AS mismatch)
                            AS m) AS t) AS d)
RETURNING r.claim_token = $3 AS won, r.status, r.last_claim, r.attempts, r.jid,
          r.duplicates, r.last_mismatch AS mismatch, r.takeovers,
          EXTRACT(EPOCH FROM r.lease_expires_at - now())::float8 AS lease_remaining,
          now() AS decided_at,
          -- Stored results (V7): what a repeat of a completed operation replays.
          r.result::text AS result, r.result_state,
          pg_current_xact_id_if_assigned()::text AS xid"#
);

/// A delivery's first statement outside a transaction (`claim::deliver`): a look at the
/// record and, only when there is none, the first claim's insert, in one round trip.
///
/// * no record: inserts it as `claimed` with the caller's token, exactly as
///   [`CLAIM_SQL`] would (`inserted` is true; no stored job): a first claim, durable;
/// * a record: returns its state (`inserted` false) and writes nothing, so the
///   statement assigns no transaction id and commits without a WAL flush;
/// * no row at all: a concurrent first claim inserted the record after this
///   statement's snapshot (`ON CONFLICT DO NOTHING` waited for it): the caller asks
///   [`CLAIM_SQL`].
///
/// Parameters: [`CLAIM_SQL`]'s $1–$8, the first-claim insert's (`first_claim_values!`:
/// $8 the delivery's facts, kept by the first claim as `first_facts`; a duplicate does not
/// read them; a first claim stores no job: issue 31). A
/// duplicate's count ($12 of [`CLAIM_SQL`]: a copy coming back is not counted again) is
/// the bookkeeping's.
///
/// A look at a completed record also returns its stored result (`result`,
/// `result_state`: see the stored results), so a replay costs no extra round trip.
pub const DELIVER_SQL: &str = concat!(
    r#"
WITH look AS (
    SELECT status, jid, attempts, duplicates, args_digest, lease_expires_at,
           claim_token = $3 AS mine, last_claim,
           -- Stored results (V7): a completed record's replay, read in the same look.
           result::text AS result, result_state
      FROM idempotent_job_records
     WHERE job_type = $1 AND operation_key = $2),
first AS (
    INSERT INTO idempotent_job_records
    "#,
    first_claim_columns!(),
    "\n    SELECT ",
    first_claim_values!(),
    r#"
     WHERE NOT EXISTS (SELECT 1 FROM look)
    ON CONFLICT (job_type, operation_key) DO NOTHING
    RETURNING status, jid, attempts, duplicates, args_digest, lease_expires_at)
SELECT true AS inserted, true AS mine, 'first' AS last_claim, status, jid, attempts,
       duplicates, args_digest,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_remaining,
       now() AS decided_at, NULL::text AS result, NULL::text AS result_state
  FROM first
UNION ALL
SELECT false, mine, last_claim, status, jid, attempts, duplicates, args_digest,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8, now(), result, result_state
  FROM look"#
);

/// The settled state of one operation, read without writing (a read-only server),
/// with a completed record's stored result (a replay, V7). Parameters: $1 job_type,
/// $2 operation_key.
pub const SETTLED_LOOK_SQL: &str = r#"
SELECT status, jid, attempts, duplicates, args_digest, now() AS decided_at,
       result::text AS result, result_state
  FROM idempotent_job_records
 WHERE job_type = $1 AND operation_key = $2
   AND status IN ('completed', 'held', 'given_up')"#;

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

/// A transactional claim's bound on its wait for another delivery's transaction, for
/// the rest of the transaction. Parameters: $1 the timeout as text (`"<n>ms"`).
pub const LOCK_TIMEOUT_SQL: &str = "SELECT set_config('lock_timeout', $1, true)";

/// The session's own `lock_timeout` again, after a transactional claim: the job's
/// statements are not bound by the claim's wait.
pub const LOCK_TIMEOUT_RESET_SQL: &str = "SET LOCAL lock_timeout TO DEFAULT";

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

/// Whether an operation is completed: the producer's check of `on_enqueue:
/// skip_completed`, made once per push. A read-only primary-key lookup; no record, a
/// claim (live or stale), a released, held or given-up operation all answer false, so
/// only a completed operation's push is dropped.
/// Parameters: $1 job_type, $2 operation_key.
pub const COMPLETED_SQL: &str = r#"
SELECT EXISTS (SELECT 1
                 FROM idempotent_job_records
                WHERE job_type = $1 AND operation_key = $2 AND status = 'completed')"#;

/// Held operations, oldest first. Parameters: $1 job_type or NULL for all, $2 limit.
/// Walks the index of records ever held (`held_at IS NOT NULL`, V10), filtering the
/// status: a record resolved since keeps its `held_at`.
pub const HELD_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE held_at IS NOT NULL AND status = 'held' AND ($1::text IS NULL OR job_type = $1)
 ORDER BY held_at, job_type, operation_key
 LIMIT $2"#;

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

/// Whether a record holds a stored job (a job class or arguments: what a rerun re-sends,
/// written by the takeover a hold or a give-up follows: [`CLAIM_SQL`]), as an SQL
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
   SET duplicates = r.duplicates + b.dups,
       last_duplicate_at = CASE WHEN b.dups > 0 THEN greatest(r.last_duplicate_at, b.last_at)
                                ELSE r.last_duplicate_at END,
       mismatches = r.mismatches + b.mismatches,
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
/// "entry": {…}}` objects, the `xid` being [`CLAIM_SQL`]'s.
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
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_remaining
  FROM idempotent_job_records
 WHERE job_type = $1 AND operation_key = $2"#;

/// The table's live columns (the table found through the connection's `search_path`),
/// or no row at all when there is no such table.
pub const COLUMNS_SQL: &str = "SELECT a.attname::text FROM pg_attribute a \
     WHERE a.attrelid = to_regclass('idempotent_job_records') AND a.attnum > 0 \
     AND NOT a.attisdropped";

// The operators' read-only lists and metrics (`report`).

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
/// when none is held); the held operations the reclaim budget held (their
/// `last_error` begins with [`RECLAIM_BUDGET_SPENT`]); the repeated deliveries recorded in the last hour (each
/// record keeps its last 20 repeat times, so an operation counts at most 20) and the
/// operations they belong to; and the purge backlog: finished records (completed or
/// given up) that finished more than $1 seconds ago, the retention — what
/// [`PURGE_SQL`] would delete with the same age. Parameters: $1
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
       coalesce(extract(epoch FROM now() - min(held_at) FILTER (WHERE status = 'held')), 0)::float8
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

/// The distributed profile's migration lock (`Config::distributed` in the config module:
/// such servers have no advisory locks): one row, made before the first migration.
pub const MIGRATION_LOCK_TABLE_SQL: &str =
    "CREATE TABLE IF NOT EXISTS idempotent_job_migration_lock \
     (id int4 PRIMARY KEY, holder text NOT NULL, locked_at timestamptz NOT NULL DEFAULT now())";

/// Takes the migration lock for holder $1 (a fresh UUID text): returns a row when taken,
/// none while another holder has it. A lock older than 15 minutes (a migrator that died
/// holding it) is taken over.
pub const MIGRATION_LOCK_SQL: &str = "INSERT INTO idempotent_job_migration_lock AS l (id, holder) \
     VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, locked_at = now() \
     WHERE l.locked_at < now() - interval '15 minutes' RETURNING l.holder";

/// Gives the migration lock of holder $1 back.
pub const MIGRATION_UNLOCK_SQL: &str =
    "DELETE FROM idempotent_job_migration_lock WHERE id = 1 AND holder = $1";
