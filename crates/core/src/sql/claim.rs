//! A delivery's statements before its job runs: the claim ([`CLAIM_SQL`]), the
//! first statement outside a transaction ([`DELIVER_SQL`], sharing the first claim's
//! insert with it), the read-only look at a settled operation ([`SETTLED_LOOK_SQL`]),
//! a transactional claim's lock timeout, and the producer's check of a completed
//! operation ([`COMPLETED_SQL`]).

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
/// `repeat_facts` entry wait for that transaction's commit (`FLUSH_AWAITING_SQL`'s `awaiting`).
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
            -- Counters saturate at int4's maximum (a record edited to it must not make
            -- every claim fail with 22003).
            least(r.attempts::int8 + d.take::int, 2147483647)::int,
            least(r.takeovers::int8 + (d.take AND r.status = 'claimed')::int, 2147483647)::int,
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
            least(r.duplicates::int8 + (NOT d.take AND NOT $12)::int, 2147483647)::int,
            CASE WHEN d.take OR $12 THEN r.last_duplicate_at ELSE now() END,
            least(r.mismatches::int8 + (d.mismatch AND NOT $12)::int, 2147483647)::int,
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
          (EXTRACT(EPOCH FROM r.lease_expires_at) - EXTRACT(EPOCH FROM now()))::float8 AS lease_remaining,
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
       (EXTRACT(EPOCH FROM lease_expires_at) - EXTRACT(EPOCH FROM now()))::float8 AS lease_remaining,
       now() AS decided_at, NULL::text AS result, NULL::text AS result_state
  FROM first
UNION ALL
SELECT false, mine, last_claim, status, jid, attempts, duplicates, args_digest,
       (EXTRACT(EPOCH FROM lease_expires_at) - EXTRACT(EPOCH FROM now()))::float8, now(), result, result_state
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

/// A transactional claim's bound on its wait for another delivery's transaction, for
/// the rest of the transaction. Parameters: $1 the timeout as text (`"<n>ms"`).
pub const LOCK_TIMEOUT_SQL: &str = "SELECT set_config('lock_timeout', $1, true)";

/// The session's own `lock_timeout` again, after a transactional claim: the job's
/// statements are not bound by the claim's wait.
pub const LOCK_TIMEOUT_RESET_SQL: &str = "SET LOCAL lock_timeout TO DEFAULT";

/// Whether an operation is completed: the producer's check of `on_enqueue:
/// skip_completed`, made once per push. A read-only primary-key lookup; no record, a
/// claim (live or stale), a released, held or given-up operation all answer false, so
/// only a completed operation's push is dropped.
/// Parameters: $1 job_type, $2 operation_key.
pub const COMPLETED_SQL: &str = r#"
SELECT EXISTS (SELECT 1
                 FROM idempotent_job_records
                WHERE job_type = $1 AND operation_key = $2 AND status = 'completed')"#;
