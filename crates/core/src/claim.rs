//! The claim protocol: one SQL text per operation, and the decision it returns.
//!
//! A delivery's decision is made by ONE statement ([`CLAIM_SQL`]) in one round trip:
//! PostgreSQL's `INSERT … ON CONFLICT DO UPDATE` takes the row lock, so concurrent
//! deliveries of one operation are serialised by the database and each sees the
//! outcome of the one before. All lease arithmetic uses the database's `now()`.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use super::bookkeeping::{Bookkeeper, Repeat};
use super::error::{Error, Result};
use super::retry::with_fresh_conn;
use super::store::{Conn, Interrupt, Lane, Pool};
use tokio_postgres::{Client, Row};

/// Longest `job_type` + `operation_key`, in bytes ([`crate::keys`] owns it).
pub use crate::keys::MAX_KEY_BYTES;

/// Longest lease accepted, in seconds (ten years; PostgreSQL intervals overflow far
/// beyond that).
pub const MAX_LEASE_SECONDS: f64 = 315_360_000.0;

/// Claim, or count a duplicate, in one statement.
///
/// * no record: insert it as `claimed` with the caller's token (a first claim);
/// * `released` (the last holder's job raised), or `claimed` with an expired lease
///   (the holder may have died): take it over with the caller's token, `attempts`+1;
/// * otherwise (`completed`, `held`, `given_up`, or `claimed` with a live lease):
///   change nothing but `duplicates`+1 and `last_duplicate_at`.
///
/// Every repeat (any delivery after the first) appends its time to `repeat_times`
/// (the last 20 are kept) and its job class to `job_classes`, for the repeats report.
///
/// A delivery whose argument digest differs from the claim's is a payload mismatch:
/// it is counted in `mismatches` and flagged in `last_mismatch`; when $10 is true
/// (`idempotency_on_mismatch: :raise`) such a delivery never takes a claim over.
///
/// `jsonb` cannot hold the character U+0000: arguments whose JSON text contains the
/// escape `\u0000` are stored as `{"idempotent_job:json": "<the JSON text>"}` (a jsonb
/// string holds the escape itself), and [`FIND_SQL`] gives the original text back, so
/// such a job still runs and a rerun gets its arguments unchanged.
///
/// `won` in the result tells the caller whether its token is now the record's;
/// `result` and `result_state` are the stored result of a completed record (a replay:
/// see [`super::results`]), NULL when its completion stored none.
/// Parameters: $1 job_type, $2 operation_key, $3 claim_token (uuid), $4 jid,
/// $5 lease in seconds (float8), $6 args_digest, $7 job_class, $8 queue,
/// $9 arguments (JSON text), $10 refuse mismatched payloads (bool), $11 the delivery's
/// facts (JSON object text or NULL): a first claim keeps them as `first_facts` for the
/// repeats report (a repeat's own facts are written off this path, by the bookkeeping).
pub const CLAIM_SQL: &str = r#"
INSERT INTO idempotent_job_records AS r
    (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at,
     args_digest, job_class, queue, args, job_classes, first_facts)
VALUES ($1, $2, 'claimed', $3, $4, $5, now() + make_interval(secs => $5),
        $6, $7, $8,
        CASE WHEN strpos($9, '\u0000') > 0 THEN jsonb_build_object('idempotent_job:json', $9)
             ELSE $9::jsonb END,
        array_remove(ARRAY[$7], NULL), $11::jsonb)
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
            CASE WHEN d.take THEN excluded.job_class ELSE r.job_class END,
            CASE WHEN d.take THEN excluded.queue ELSE r.queue END,
            CASE WHEN d.take THEN excluded.args ELSE r.args END,
            r.duplicates + (NOT d.take)::int,
            CASE WHEN d.take THEN r.last_duplicate_at ELSE now() END,
            r.mismatches + d.mismatch::int,
            d.mismatch,
            (r.repeat_times || now())[greatest(1, cardinality(r.repeat_times) - 18):],
            CASE WHEN excluded.job_class IS NULL OR excluded.job_class = ANY (r.job_classes)
                 THEN r.job_classes ELSE r.job_classes || excluded.job_class END,
            now()
       FROM (SELECT m.mismatch,
                    NOT (m.mismatch AND $10)
                    AND (r.status = 'released'
                         OR (r.status = 'claimed' AND r.lease_expires_at <= now())) AS take
               FROM (SELECT r.args_digest IS NOT NULL
                            AND r.args_digest <> excluded.args_digest AS mismatch) AS m) AS d)
RETURNING r.claim_token = $3 AS won, r.status, r.last_claim, r.attempts, r.jid,
          r.duplicates, r.last_mismatch AS mismatch,
          EXTRACT(EPOCH FROM r.lease_expires_at - now())::float8 AS lease_remaining,
          now() AS decided_at,
          -- Stored results (V7): what a repeat of a completed operation replays.
          r.result::text AS result, r.result_state"#;

/// A delivery's first statement outside a transaction ([`deliver`]): a look at the
/// record and, only when there is none, the first claim's insert, in one round trip.
///
/// * no record: inserts it as `claimed` with the caller's token, exactly as
///   [`CLAIM_SQL`] would (`inserted` is true): a first claim, durable;
/// * a record: returns its state (`inserted` false) and writes nothing, so the
///   statement assigns no transaction id and commits without a WAL flush;
/// * no row at all: a concurrent first claim inserted the record after this
///   statement's snapshot (`ON CONFLICT DO NOTHING` waited for it): the caller asks
///   [`CLAIM_SQL`].
///
/// Parameters: as [`CLAIM_SQL`]'s $1–$9, then $10 the delivery's facts ([`CLAIM_SQL`]'s
/// $11: kept by the first claim as `first_facts`; a duplicate does not read it).
///
/// A look at a completed record also returns its stored result (`result`,
/// `result_state`: see [`super::results`]), so a replay costs no extra round trip.
pub const DELIVER_SQL: &str = r#"
WITH look AS (
    SELECT status, jid, attempts, duplicates, args_digest, lease_expires_at,
           claim_token = $3 AS mine, last_claim,
           -- Stored results (V7): a completed record's replay, read in the same look.
           result::text AS result, result_state
      FROM idempotent_job_records
     WHERE job_type = $1 AND operation_key = $2),
first AS (
    INSERT INTO idempotent_job_records
        (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at,
         args_digest, job_class, queue, args, job_classes, first_facts)
    SELECT $1, $2, 'claimed', $3, $4, $5, now() + make_interval(secs => $5),
           $6, $7, $8,
           CASE WHEN strpos($9, '\u0000') > 0 THEN jsonb_build_object('idempotent_job:json', $9)
                ELSE $9::jsonb END,
           array_remove(ARRAY[$7::text], NULL), $10::jsonb
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
  FROM look"#;

/// A change that only the current claim holder may make. Every fenced statement
/// has the same guard: the record is still `claimed` under the caller's token.
/// Parameters: $1 job_type, $2 operation_key, $3 claim_token, then the change's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Mark the claim completed: the effect is done. `completed_at` is the time the
    /// statement runs (`clock_timestamp()`), not its transaction's start: inside a
    /// transactional claim it follows the job's own statements, so a copy that arrived
    /// meanwhile (and waited on the row lock) is seen to have arrived before it.
    ///
    /// Stored results (V7): $4 the body's result as JSON text (or NULL) and $5 its
    /// `result_state` (NULL when no store was requested; see [`super::results`]) are
    /// written by the same statement. A completion with a store request also wakes the
    /// callers waiting for it (`pg_notify` on the record's channel, sent at commit:
    /// [`super::results::channel`]); a plain completion notifies nobody (no extra cost).
    Complete,
    /// [`Fenced::Complete`], committed with `synchronous_commit = off` (the
    /// `asynchronous_completion` setting; never inside a transaction).
    CompleteAsynchronously,
    /// Give the claim back after the job raised ($4: error text); the next delivery
    /// (Sidekiq's retry) claims again at once.
    Release,
    /// `:hold` policy: keep the operation from running until a person resolves it.
    Hold,
    /// `:skip` policy: give the operation up (a rare miss).
    GiveUp,
    /// End the lease now, so the next delivery treats the claim as stale again (an
    /// outside lookup failed and nothing may run blindly).
    Expire,
    /// Heartbeat: renew the lease for another `lease_seconds` from now.
    Renew,
}

impl Fenced {
    /// The statement, fenced by the claim token.
    pub fn sql(self) -> &'static str {
        match self {
            // Completion, release, hold and give-up are idempotent for their own token:
            // a repeat (the first answer was lost to an interrupt or a dead connection)
            // succeeds and changes nothing. Expire and renew only move the lease, so a
            // repeat is harmless too: every fenced change is safe to send again.
            // Results (V7): `result = $4, result_state = $5` and the RETURNING's
            // pg_notify (only when $5 is set) are the only additions to the completion.
            Fenced::Complete => concat!(
                "UPDATE idempotent_job_records SET status = 'completed', \
                 completed_at = CASE WHEN status = 'completed' THEN completed_at ELSE clock_timestamp() END, \
                 result = $4::text::jsonb, result_state = $5::text, \
                 updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
                 AND claim_token = $3 AND status IN ('claimed', 'completed') \
                 RETURNING (SELECT pg_notify(",
                notify_channel!(),
                ", '') WHERE $5::text IS NOT NULL) IS NULL AS notified"
            ),
            Fenced::CompleteAsynchronously => concat!(
                "UPDATE idempotent_job_records SET status = 'completed', \
                 completed_at = CASE WHEN status = 'completed' THEN completed_at ELSE clock_timestamp() END, \
                 result = $4::text::jsonb, result_state = $5::text, \
                 updated_at = now() \
                 FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
                 WHERE job_type = $1 AND operation_key = $2 \
                 AND claim_token = $3 AND status IN ('claimed', 'completed') \
                 RETURNING (SELECT pg_notify(",
                notify_channel!(),
                ", '') WHERE $5::text IS NOT NULL) IS NULL AS notified"
            ),
            // A release wakes waiting callers too (they may claim and run now): a
            // failure path, so the notification's cost does not matter.
            Fenced::Release => concat!(
                "UPDATE idempotent_job_records SET status = 'released', \
                 released_at = CASE WHEN status = 'released' THEN released_at ELSE now() END, \
                 last_error = $4, updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
                 AND claim_token = $3 AND status IN ('claimed', 'released') \
                 RETURNING (SELECT pg_notify(",
                notify_channel!(),
                ", '')) IS NULL AS notified"
            ),
            Fenced::Hold => {
                "UPDATE idempotent_job_records SET status = 'held', \
                 held_at = CASE WHEN status = 'held' THEN held_at ELSE now() END, \
                 updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
                 AND claim_token = $3 AND status IN ('claimed', 'held')"
            }
            Fenced::GiveUp => {
                "UPDATE idempotent_job_records SET status = 'given_up', \
                 given_up_at = CASE WHEN status = 'given_up' THEN given_up_at ELSE now() END, \
                 updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
                 AND claim_token = $3 AND status IN ('claimed', 'given_up')"
            }
            Fenced::Expire => {
                "UPDATE idempotent_job_records SET lease_expires_at = now(), last_error = $4, \
                 updated_at = now() WHERE job_type = $1 AND operation_key = $2 \
                 AND claim_token = $3 AND status = 'claimed'"
            }
            Fenced::Renew => {
                "UPDATE idempotent_job_records \
                 SET lease_expires_at = now() + make_interval(secs => lease_seconds), \
                 heartbeat_at = now(), updated_at = now() WHERE job_type = $1 \
                 AND operation_key = $2 AND claim_token = $3 AND status = 'claimed'"
            }
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Fenced::Complete | Fenced::CompleteAsynchronously => "complete",
            Fenced::Release => "release",
            Fenced::Hold => "hold",
            Fenced::GiveUp => "give up",
            Fenced::Expire => "expire",
            Fenced::Renew => "renew",
        }
    }
}

/// Defines the record once: each column of [`Record`] with its Rust type, the kind of
/// value it is for other layers ([`Field`]) and its expression in [`FIND_SQL`]'s select
/// list (named after the field). From that one list come the struct, [`FIND_SQL`], the
/// row's conversion ([`Record::from_row`]), the column names ([`Record::COLUMNS`]) and
/// the named values the Ruby layer converts ([`Record::fields`]).
macro_rules! record {
    (
        $(#[$meta:meta])*
        pub struct Record {
            $(#[$first_doc:meta])* $first:ident: $first_ty:ty => $first_kind:ident = $first_sql:literal,
            $($(#[$doc:meta])* $field:ident: $ty:ty => $kind:ident = $sql:literal,)*
        }
        $(#[$find_doc:meta])*
        pub const FIND_SQL = SELECT ... $from:literal;
    ) => {
        $(#[$meta])*
        pub struct Record {
            $(#[$first_doc])* pub $first: $first_ty,
            $($(#[$doc])* pub $field: $ty,)*
        }

        $(#[$find_doc])*
        pub const FIND_SQL: &str = concat!(
            "SELECT ", $first_sql, " AS ", stringify!($first),
            $(",\n       ", $sql, " AS ", stringify!($field),)*
            $from
        );

        impl Record {
            /// The record's column names, in [`FIND_SQL`]'s order (its select list's names).
            pub const COLUMNS: &'static [&'static str] = &[stringify!($first), $(stringify!($field)),*];

            /// A row of [`FIND_SQL`] as a record.
            ///
            /// Errors: a column missing or of another type ([`Error::Database`]).
            pub fn from_row(row: &Row) -> Result<Record> {
                Ok(Record {
                    $first: row.try_get(stringify!($first))?,
                    $($field: row.try_get(stringify!($field))?,)*
                })
            }

            /// Every column's name and value, in [`Record::COLUMNS`]' order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, Field<'_>)> {
                [
                    (stringify!($first), Field::$first_kind(&self.$first)),
                    $((stringify!($field), Field::$kind(&self.$field)),)*
                ]
                .into_iter()
            }
        }
    };
}

/// One column's value of a [`Record`], by kind, for a layer that converts it (the Ruby
/// binding makes a String, a Symbol, an Integer, a Float, true/false, a Time or nil).
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    /// Text.
    Text(&'a String),
    /// Text or NULL.
    OptText(&'a Option<String>),
    /// One of a few names (status, last_claim): a Symbol in Ruby.
    Name(&'a String),
    /// An integer.
    Int(&'a i32),
    /// A number of seconds.
    Float(&'a f64),
    /// A boolean.
    Bool(&'a bool),
    /// A claim token.
    Token(&'a Uuid),
    /// A time (UTC).
    Time(&'a DateTime<Utc>),
    /// A time (UTC) or NULL.
    OptTime(&'a Option<DateTime<Utc>>),
}

record! {
    /// A whole idempotency record, as stored. Times are UTC.
    #[derive(Debug, Clone)]
    pub struct Record {
        job_type: String => Text = "job_type",
        operation_key: String => Text = "operation_key",
        status: String => Name = "status",
        claim_token: Uuid => Token = "claim_token",
        attempts: i32 => Int = "attempts",
        takeovers: i32 => Int = "takeovers",
        last_claim: String => Name = "last_claim",
        jid: Option<String> => OptText = "jid",
        duplicates: i32 => Int = "duplicates",
        lease_seconds: f64 => Float = "lease_seconds",
        /// Whether `lease_expires_at` has passed, by the database clock.
        lease_expired: bool => Bool = "lease_expires_at <= now()",
        last_error: Option<String> => OptText = "last_error",
        args_digest: Option<String> => OptText = "args_digest",
        job_class: Option<String> => OptText = "job_class",
        queue: Option<String> => OptText = "queue",
        /// The claiming delivery's arguments as JSON text (unwrapped when [`CLAIM_SQL`]
        /// had to wrap them).
        args_json: Option<String> => OptText = "coalesce(args ->> 'idempotent_job:json', args::text)",
        mismatches: i32 => Int = "mismatches",
        last_mismatch: bool => Bool = "last_mismatch",
        resolution: Option<String> => OptText = "resolution",
        first_claimed_at: DateTime<Utc> => Time = "first_claimed_at",
        claimed_at: DateTime<Utc> => Time = "claimed_at",
        lease_expires_at: DateTime<Utc> => Time = "lease_expires_at",
        completed_at: Option<DateTime<Utc>> => OptTime = "completed_at",
        released_at: Option<DateTime<Utc>> => OptTime = "released_at",
        last_duplicate_at: Option<DateTime<Utc>> => OptTime = "last_duplicate_at",
        heartbeat_at: Option<DateTime<Utc>> => OptTime = "heartbeat_at",
        held_at: Option<DateTime<Utc>> => OptTime = "held_at",
        given_up_at: Option<DateTime<Utc>> => OptTime = "given_up_at",
        resolved_at: Option<DateTime<Utc>> => OptTime = "resolved_at",
        /// The stored result as JSON text (V7; NULL when none is stored).
        result_json: Option<String> => OptText = "result::text",
        /// `stored`, `too_large` or `unencodable` (V7; NULL: no store was requested).
        result_state: Option<String> => OptText = "result_state",
        updated_at: DateTime<Utc> => Time = "updated_at",
    }
    /// Read one record: [`Record`]'s columns. Parameters: $1 job_type, $2 operation_key.
    pub const FIND_SQL = SELECT ... "\n  FROM idempotent_job_records\n WHERE job_type = $1 AND operation_key = $2";
}

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
pub const HELD_SQL: &str = r#"
SELECT job_type, operation_key
  FROM idempotent_job_records
 WHERE status = 'held' AND ($1::text IS NULL OR job_type = $1)
 ORDER BY held_at, job_type, operation_key
 LIMIT $2"#;

/// Delete one batch of finished records (completed or given up) that finished more
/// than $1 seconds ago, at most $2 of them, taken in the retention index's order
/// (finish time, job type, operation key) after the key ($3 finish time, $4 job type,
/// $5 operation key; all NULL for the first batch): keyset pagination, so a batch
/// starts where the previous one ended and never reads the index entries of the
/// records earlier batches deleted (dead until VACUUM). Rows locked by a claim in
/// progress are skipped, never waited for; held and live or stale claims are never
/// touched. Returns one row: deleted, picked (rows the batch locked), and the last
/// picked key (NULLs when it picked none), the next batch's $3..$5.
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
  SELECT job_type, operation_key, coalesce(completed_at, given_up_at) AS finished_at
    FROM idempotent_job_records
   WHERE status IN ('completed', 'given_up')
     AND coalesce(completed_at, given_up_at) < now() - make_interval(secs => $1)
     AND (coalesce(completed_at, given_up_at), job_type, operation_key)
         > (coalesce($3, '-infinity'), coalesce($4, ''), coalesce($5, ''))
   ORDER BY coalesce(completed_at, given_up_at), job_type, operation_key
   LIMIT $2
     FOR UPDATE SKIP LOCKED),
gone AS (
  DELETE FROM idempotent_job_records r
   USING unnest(ARRAY(SELECT job_type FROM doomed ORDER BY finished_at, job_type, operation_key),
                ARRAY(SELECT operation_key FROM doomed ORDER BY finished_at, job_type, operation_key))
         AS d (job_type, operation_key)
   WHERE r.job_type = d.job_type AND r.operation_key = d.operation_key
  RETURNING 1)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM doomed) AS picked,
       last.finished_at, last.job_type, last.operation_key
  FROM (SELECT) AS one
  LEFT JOIN (SELECT finished_at, job_type, operation_key
               FROM doomed
              ORDER BY finished_at DESC, job_type DESC, operation_key DESC
              LIMIT 1) AS last ON true"#;

/// Operations delivered more than once since $1 (optionally of job type $2), for the
/// repeats report: their counts, first claim and repeat times, delivering classes, the
/// last claiming delivery's id, the completion time, the first claim's facts and each
/// repeat's recorded facts (the last 20: bounded per operation).
pub const REPEATS_SQL: &str = r#"
SELECT job_type, operation_key, status, attempts, takeovers, duplicates, mismatches,
       first_claimed_at, repeat_times, job_classes, jid, completed_at,
       first_facts::text AS first_facts, repeat_facts::text AS repeat_facts
  FROM idempotent_job_records
 WHERE cardinality(repeat_times) > 0
   AND repeat_times[cardinality(repeat_times)] >= $1
   AND ($2::text IS NULL OR job_type = $2)
 ORDER BY job_type, first_claimed_at"#;

/// Settle a held (or given-up) operation. $3 `done`: mark it completed; `rerun`: mark
/// it released so the re-enqueued delivery claims it as a retry.
/// Parameters: $1 job_type, $2 operation_key, $3 resolution.
pub const RESOLVE_SQL: &str = r#"
UPDATE idempotent_job_records
   SET status = CASE WHEN $3 = 'done' THEN 'completed' ELSE 'released' END,
       completed_at = CASE WHEN $3 = 'done' THEN now() ELSE completed_at END,
       released_at = CASE WHEN $3 = 'done' THEN released_at ELSE now() END,
       resolution = $3, resolved_at = now(), updated_at = now()
 WHERE job_type = $1 AND operation_key = $2 AND status IN ('held', 'given_up')"#;

/// One delivery's request for a claim. Owned, so it can cross into a runtime
/// thread while the caller's language runtime goes on.
#[derive(Debug, Clone, Default)]
pub struct ClaimRequest {
    /// The job type (idempotency scope), e.g. `"ChargeOrderJob"`.
    pub job_type: String,
    /// The canonical operation key, e.g. `"42"`.
    pub operation_key: String,
    /// The delivering job's id, stored as the record's last claiming jid.
    pub jid: Option<String>,
    /// Lease length in seconds (> 0).
    pub lease_seconds: f64,
    /// Digest of the delivery's canonical arguments (payload mismatch detection).
    pub args_digest: Option<String>,
    /// Job class, queue and arguments (JSON text) stored for `resolve(as: :rerun)`.
    pub job_class: Option<String>,
    pub queue: Option<String>,
    pub args_json: Option<String>,
    /// Never take a claim over with a mismatched payload (`on_mismatch: :raise`).
    pub refuse_mismatch: bool,
    /// The door's facts about this delivery (delivery id, retry count, enqueued at…):
    /// a JSON object text, kept by a first claim (`first_facts`) and stored with the
    /// operation's repeats (`repeat_facts`).
    pub facts_json: Option<String>,
}

/// How a won claim was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// No record existed: the first delivery of this operation.
    First,
    /// The previous holder's job raised and released its claim (a Sidekiq retry), or a
    /// person resolved a held operation for a rerun.
    Retry,
    /// The previous claim's lease had expired: its holder may have died. Its effect
    /// may or may not have happened (a stale claim): the stale policy decides.
    Takeover,
}

impl ClaimKind {
    /// The name stored in `last_claim`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::First => "first",
            ClaimKind::Retry => "retry",
            ClaimKind::Takeover => "takeover",
        }
    }
}

impl Outcome {
    /// The outcome's name, as the Ruby layer and `repeat_facts` spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Claimed { kind, .. } => match kind {
                ClaimKind::First => "claimed",
                ClaimKind::Retry => "retry",
                ClaimKind::Takeover => "takeover",
            },
            Outcome::Completed { .. } => "completed",
            Outcome::InProgress { .. } => "in_progress",
            Outcome::Held { .. } => "held",
            Outcome::GivenUp { .. } => "given_up",
            Outcome::Refused { .. } => "refused",
        }
    }
}

/// What a delivery should do, decided atomically by [`claim`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Run the job. `token` must be presented to every [`Fenced`] change.
    Claimed {
        token: Uuid,
        /// Claims made on this record, this one included (1 for a first claim).
        attempt: i32,
        kind: ClaimKind,
    },
    /// The operation already completed: do not run. `duplicates` counts this one.
    /// `replay`: what its completion stored (None when no store was requested).
    Completed {
        duplicates: i32,
        replay: Option<super::results::Replay>,
    },
    /// Another delivery holds a live claim: do not run now; try again once
    /// `lease_remaining` seconds have passed (by the database clock).
    InProgress {
        holder_jid: Option<String>,
        attempt: i32,
        lease_remaining: f64,
        duplicates: i32,
    },
    /// Held for a person (`:hold` policy): do not run.
    Held { duplicates: i32 },
    /// Given up (`:skip` policy): do not run.
    GivenUp { duplicates: i32 },
    /// The claim is released or stale, but this delivery's arguments differ from the
    /// claim's and mismatches are refused: do not run.
    Refused { duplicates: i32 },
}

/// [`claim`]'s answer: the outcome, and whether this delivery's arguments differed
/// from those of the operation's claim (a payload mismatch).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    pub mismatch: bool,
}

/// Checks a request before any statement: non-empty key and job type within
/// [`MAX_KEY_BYTES`], a lease in (0, [`MAX_LEASE_SECONDS`]].
///
/// Errors: [`Error::Config`] naming the job type.
pub fn check_request(req: &ClaimRequest) -> Result<()> {
    check_key(&req.job_type, &req.operation_key)?;
    if !(req.lease_seconds > 0.0 && req.lease_seconds <= MAX_LEASE_SECONDS) {
        return Err(Error::Config(format!(
            "the lease of {} must be a positive number of seconds up to {MAX_LEASE_SECONDS}, got {}",
            req.job_type, req.lease_seconds
        )));
    }
    if let Some(facts) = &req.facts_json {
        if !matches!(
            serde_json::from_str(facts),
            Ok(serde_json::Value::Object(_))
        ) {
            return Err(Error::Config(format!(
                "the delivery facts of {} must be a JSON object text, got {facts:?}",
                req.job_type
            )));
        }
    }
    Ok(())
}

fn check_key(job_type: &str, operation_key: &str) -> Result<()> {
    if job_type.is_empty() {
        return Err(Error::Config("job_type must not be empty".into()));
    }
    if operation_key.is_empty() {
        return Err(Error::Config(format!(
            "the operation key of {job_type} must not be empty"
        )));
    }
    if job_type.len() + operation_key.len() > MAX_KEY_BYTES {
        return Err(Error::Config(format!(
            "the operation key of {job_type} is {} bytes; job type and key together must \
             stay under {MAX_KEY_BYTES} bytes (declare a narrower idempotency_key)",
            operation_key.len()
        )));
    }
    Ok(())
}

/// Decides one delivery in one round trip (see [`CLAIM_SQL`]), sent as the
/// connection's named prepared statement or as an unnamed one (see
/// [`Conn::query_own`]).
///
/// Errors: [`Error::Config`] for an empty/oversized key or a non-positive lease,
/// [`Error::Connection`] / [`Error::Database`] from PostgreSQL.
pub async fn claim(conn: &Conn, req: &ClaimRequest) -> Result<Decision> {
    claim_as(conn, req, Uuid::new_v4()).await
}

/// [`claim`] with the caller's fencing token: sending the same request again with the
/// same token (its first answer was lost with its connection) wins again if the first
/// one won, so a claim is safe to repeat on a fresh connection.
///
/// Errors: as [`claim`]; before the first claim of a process, a table that lacks
/// columns is refused ([`super::schema::ensure`]).
pub async fn claim_as(conn: &Conn, req: &ClaimRequest, token: Uuid) -> Result<Decision> {
    Ok(claim_at(conn, req, token).await?.0)
}

/// [`CLAIM_SQL`]'s parameters $1–$11 for `req`, with `token` as $3.
fn claim_params<'a>(
    req: &'a ClaimRequest,
    token: &'a Uuid,
) -> [(&'a (dyn ToSql + Sync), Type); 11] {
    [
        (&req.job_type, Type::TEXT),
        (&req.operation_key, Type::TEXT),
        (token, Type::UUID),
        (&req.jid, Type::TEXT),
        (&req.lease_seconds, Type::FLOAT8),
        (&req.args_digest, Type::TEXT),
        (&req.job_class, Type::TEXT),
        (&req.queue, Type::TEXT),
        (&req.args_json, Type::TEXT),
        (&req.refuse_mismatch, Type::BOOL),
        (&req.facts_json, Type::TEXT),
    ]
}

/// [`claim_as`], and the database time of the decision.
async fn claim_at(
    conn: &Conn,
    req: &ClaimRequest,
    token: Uuid,
) -> Result<(Decision, DateTime<Utc>)> {
    check_request(req)?;
    super::schema::ensure(conn, &req.job_type, &req.operation_key).await?;
    let result = conn.query_own(CLAIM_SQL, &claim_params(req, &token)).await;
    let rows = result?;
    let row = rows
        .first()
        .ok_or_else(|| Error::connection("the claim statement returned no row"))?;
    let at = row.try_get("decided_at")?;
    let decision = decide(
        ClaimRow {
            won: row.try_get("won")?,
            status: row.try_get("status")?,
            last_claim: row.try_get("last_claim")?,
            attempts: row.try_get("attempts")?,
            jid: row.try_get("jid")?,
            duplicates: row.try_get("duplicates")?,
            mismatch: row.try_get("mismatch")?,
            lease_remaining: row.try_get("lease_remaining")?,
            result: row.try_get("result")?,
            result_state: row.try_get("result_state")?,
        },
        token,
        req,
    )?;
    Ok((decision, at))
}

/// Decides one delivery outside a transaction, durably only when it must.
///
/// One statement first ([`DELIVER_SQL`]): with no record it makes the first claim
/// (durable, one round trip, as [`CLAIM_SQL`] would); when the operation is
/// completed, held, given up or claimed under a live lease, the record's state is
/// the answer and nothing is written (no transaction id, no WAL flush), and the
/// duplicate's bookkeeping is queued for the background writer
/// ([`super::bookkeeping`]). Otherwise (released, a stale claim, or a concurrent
/// first claim that committed after the statement's snapshot) [`CLAIM_SQL`] decides,
/// durably: a takeover or a retry is never decided by the look, and the race never
/// yields a wrong answer. `duplicates` in a look's answer counts this delivery, those
/// written, and this process's still queued (informative: a batch being written at
/// that moment may be missed or counted twice; the record's own count is exact).
/// On a read-only server (SQLSTATE 25006) a duplicate of a completed, held or given-up
/// operation is still answered, from a read (see [`SETTLED_LOOK_SQL`]).
///
/// Errors: as [`claim`].
pub fn deliver(pool: &Pool, interrupt: &Interrupt<'_>, req: &ClaimRequest) -> Result<Decision> {
    check_request(req)?;
    let books = pool.bookkeeper();
    // One token for every attempt: sent again on a fresh connection after its first
    // answer was lost, a claim that had won is found as this delivery's own.
    let token = Uuid::new_v4();
    let (decision, repeat) = with_fresh_conn(pool, interrupt, Lane::Main, async |c| {
        look_or_claim(c, req, token, books).await
    })?;
    if let Some(repeat) = repeat {
        books.record(repeat);
    }
    Ok(decision)
}

async fn look_or_claim(
    conn: &Conn,
    req: &ClaimRequest,
    token: Uuid,
    books: &Bookkeeper,
) -> Result<(Decision, Option<Repeat>)> {
    super::schema::ensure(conn, &req.job_type, &req.operation_key).await?;
    // DELIVER_SQL takes CLAIM_SQL's parameters but $10 (its $10 is CLAIM_SQL's $11).
    let params = claim_params(req, &token);
    let (first, facts) = params.split_at(9);
    let params = [first, &facts[1..]].concat();
    let rows = match conn.query_own(DELIVER_SQL, &params).await {
        Err(e) if e.sqlstate() == Some("25006") => {
            return read_only_answer(conn, req, books, e).await
        }
        rows => rows?,
    };
    if let Some(row) = rows.first() {
        let inserted: bool = row.try_get("inserted")?;
        let status: String = row.try_get("status")?;
        let lease_remaining: f64 = row.try_get("lease_remaining")?;
        if !inserted && status == "claimed" && row.try_get::<_, bool>("mine")? {
            // This delivery's own claim, made by an attempt whose answer was lost.
            let decision = decide(
                ClaimRow {
                    won: true,
                    status,
                    last_claim: row.try_get("last_claim")?,
                    attempts: row.try_get("attempts")?,
                    jid: row.try_get("jid")?,
                    duplicates: row.try_get("duplicates")?,
                    mismatch: false,
                    lease_remaining,
                    result: None,
                    result_state: None,
                },
                token,
                req,
            )?;
            return Ok((decision, None));
        }
        let live = status == "claimed" && lease_remaining > 0.0;
        if inserted || live || matches!(status.as_str(), "completed" | "held" | "given_up") {
            let digest: Option<String> = row.try_get("args_digest")?;
            let mismatch =
                !inserted && matches!((&digest, &req.args_digest), (Some(a), Some(b)) if a != b);
            // Counted so far: what is written, what this process has still queued, and
            // this delivery (a batch being written at this moment may be counted twice
            // or not at all: the answer's count is informative, the record's is exact).
            let duplicates: i32 = row.try_get::<_, i32>("duplicates")?
                + i32::try_from(books.pending(&req.job_type, &req.operation_key)).unwrap_or(0);
            let decision = decide(
                ClaimRow {
                    won: inserted,
                    status,
                    last_claim: "first".into(),
                    attempts: row.try_get("attempts")?,
                    jid: row.try_get("jid")?,
                    duplicates: duplicates + i32::from(!inserted),
                    mismatch,
                    lease_remaining,
                    result: row.try_get("result")?,
                    result_state: row.try_get("result_state")?,
                },
                token,
                req,
            )?;
            let at = row.try_get("decided_at")?;
            let repeat = (!inserted).then(|| Repeat::new(req, &decision, at, true));
            return Ok((decision, repeat));
        }
    }
    claim_noting(conn, req, token).await
}

/// The settled state of one operation, read without writing (a read-only server),
/// with a completed record's stored result (a replay, V7). Parameters: $1 job_type,
/// $2 operation_key.
pub const SETTLED_LOOK_SQL: &str = r#"
SELECT status, jid, attempts, duplicates, args_digest, now() AS decided_at,
       result::text AS result, result_state
  FROM idempotent_job_records
 WHERE job_type = $1 AND operation_key = $2
   AND status IN ('completed', 'held', 'given_up')"#;

/// The answer to a delivery the server refused to decide because it is read-only
/// (`read_only`: SQLSTATE 25006, a failover in progress, a standby reached): a
/// duplicate of a completed, held or given-up operation needs only a read
/// ([`SETTLED_LOOK_SQL`]), so it is answered as the look would; its count is queued
/// for the bookkeeping, which keeps it until the server takes writes again
/// ([`super::bookkeeping`]). Anything else (no record, a claim, a release) needs a
/// write: `read_only` is returned (retried on fresh connections until the deadline).
async fn read_only_answer(
    conn: &Conn,
    req: &ClaimRequest,
    books: &Bookkeeper,
    read_only: Error,
) -> Result<(Decision, Option<Repeat>)> {
    let rows = conn
        .query_own(
            SETTLED_LOOK_SQL,
            &[
                (&req.job_type, Type::TEXT),
                (&req.operation_key, Type::TEXT),
            ],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Err(read_only);
    };
    let digest: Option<String> = row.try_get("args_digest")?;
    let mismatch = matches!((&digest, &req.args_digest), (Some(a), Some(b)) if a != b);
    let duplicates: i32 = row.try_get::<_, i32>("duplicates")?
        + i32::try_from(books.pending(&req.job_type, &req.operation_key)).unwrap_or(0);
    let decision = decide(
        ClaimRow {
            won: false,
            status: row.try_get("status")?,
            last_claim: "first".into(),
            attempts: row.try_get("attempts")?,
            jid: row.try_get("jid")?,
            duplicates: duplicates + 1,
            mismatch,
            lease_remaining: 0.0,
            result: row.try_get("result")?,
            result_state: row.try_get("result_state")?,
        },
        Uuid::nil(),
        req,
    )?;
    let at = row.try_get("decided_at")?;
    let repeat = Repeat::new(req, &decision, at, true);
    Ok((decision, Some(repeat)))
}

/// [`claim_as`], and the bookkeeping of its delivery when it is a repeat (anything but a
/// first claim): its `repeat_facts` entry, for the caller to queue
/// ([`Bookkeeper::record`]) once the decision is durable. [`CLAIM_SQL`] already counted
/// the repeat itself, so the entry adds no counts.
///
/// Errors: as [`claim`].
pub async fn claim_noting(
    conn: &Conn,
    req: &ClaimRequest,
    token: Uuid,
) -> Result<(Decision, Option<Repeat>)> {
    let (decision, at) = claim_at(conn, req, token).await?;
    let repeat = Repeat::after_claim(req, &decision, at);
    Ok((decision, repeat))
}

/// The columns [`CLAIM_SQL`] returns, read by whichever driver ran it (the native
/// pool, or ActiveRecord's connection for `idempotency_transaction: :active_record`).
#[derive(Debug, Clone)]
pub struct ClaimRow {
    pub won: bool,
    pub status: String,
    pub last_claim: String,
    pub attempts: i32,
    pub jid: Option<String>,
    pub duplicates: i32,
    pub mismatch: bool,
    pub lease_remaining: f64,
    /// A completed record's stored result (JSON text) and `result_state` (V7).
    pub result: Option<String>,
    pub result_state: Option<String>,
}

/// Turns the row of [`CLAIM_SQL`] into the delivery's [`Decision`]: the one place
/// that reads a claim's outcome. `token` is the token the caller sent as $3.
pub fn decide(row: ClaimRow, token: Uuid, req: &ClaimRequest) -> Result<Decision> {
    let ClaimRow {
        won,
        status,
        last_claim,
        attempts: attempt,
        jid,
        duplicates,
        mismatch,
        lease_remaining,
        result,
        result_state,
    } = row;
    let lease_remaining = lease_remaining.max(0.0);
    let outcome = if won {
        let kind = match last_claim.as_str() {
            "takeover" => ClaimKind::Takeover,
            "retry" => ClaimKind::Retry,
            _ => ClaimKind::First,
        };
        Outcome::Claimed {
            token,
            attempt,
            kind,
        }
    } else {
        match status.as_str() {
            "completed" => Outcome::Completed {
                duplicates,
                replay: super::results::Replay::from_columns(result, result_state.as_deref())?,
            },
            "held" => Outcome::Held { duplicates },
            "given_up" => Outcome::GivenUp { duplicates },
            "claimed" if lease_remaining > 0.0 => Outcome::InProgress {
                holder_jid: jid,
                attempt,
                lease_remaining,
                duplicates,
            },
            "claimed" | "released" => Outcome::Refused { duplicates },
            other => {
                return Err(Error::Database {
                    message: format!(
                        "idempotency record {}/{} has status {other:?}, which this version of \
                         idempotent_job does not know (run the latest migrations and gem)",
                        req.job_type, req.operation_key
                    ),
                    sqlstate: "XX000".into(),
                })
            }
        }
    };
    Ok(Decision { outcome, mismatch })
}

/// Applies a [`Fenced`] change to the claim `token`. `text` is the change's own
/// parameter ($4: the error text of [`Fenced::Release`] and [`Fenced::Expire`]). A
/// completion made here stores no result (see [`fenced_with_result`]).
///
/// Sent like the claim (see [`Conn::query_own`]).
///
/// Errors: [`Error::LostClaim`] when `token` is no longer the record's claim (the
/// lease ran out and another delivery took over, or the claim already ended);
/// connection/database errors.
pub async fn fenced(
    conn: &Conn,
    change: Fenced,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    text: Option<&str>,
) -> Result<()> {
    fenced_with_result(conn, change, job_type, operation_key, token, text, None).await
}

/// [`fenced`], with the body's result for a completion ([`Fenced::Complete`] /
/// [`Fenced::CompleteAsynchronously`]): `result` (from [`super::results::prepare`]) is
/// written by the completion statement itself ($4, $5), so storing it costs no extra
/// round trip; `None` stores nothing (no store requested). Ignored by other changes.
///
/// Errors: as [`fenced`].
pub async fn fenced_with_result(
    conn: &Conn,
    change: Fenced,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    text: Option<&str>,
    result: Option<&super::results::PreparedResult>,
) -> Result<()> {
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
        (&job_type, Type::TEXT),
        (&operation_key, Type::TEXT),
        (&token, Type::UUID),
    ];
    let text = text.unwrap_or_default();
    if matches!(change, Fenced::Release | Fenced::Expire) {
        params.push((&text, Type::TEXT));
    }
    let (json, state) = super::results::params(result);
    if matches!(change, Fenced::Complete | Fenced::CompleteAsynchronously) {
        params.push((&json, Type::TEXT));
        params.push((&state, Type::TEXT));
    }
    let result = conn.execute_own(change.sql(), &params).await;
    match result? {
        1 => Ok(()),
        _ => Err(Error::LostClaim {
            job_type: job_type.to_string(),
            operation_key: operation_key.to_string(),
            message: format!(
                "cannot {} {job_type} operation {operation_key:?}: claim {token} is no longer \
                 held (its lease ran out and another delivery took the operation over)",
                change.verb()
            ),
        }),
    }
}

/// Marks the claim `token` completed ([`fenced`] with [`Fenced::Complete`]).
pub async fn complete(conn: &Conn, job_type: &str, operation_key: &str, token: Uuid) -> Result<()> {
    fenced(conn, Fenced::Complete, job_type, operation_key, token, None).await
}

/// Marks the claim `token` completed with the body's result, in one statement
/// ([`fenced_with_result`] with [`Fenced::Complete`]; `asynchronous` for
/// [`Fenced::CompleteAsynchronously`]). `result`: [`super::results::prepare`]'s answer.
///
/// Errors: as [`fenced`].
pub async fn complete_with_result(
    conn: &Conn,
    asynchronous: bool,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    result: &super::results::PreparedResult,
) -> Result<()> {
    let change = if asynchronous {
        Fenced::CompleteAsynchronously
    } else {
        Fenced::Complete
    };
    fenced_with_result(
        conn,
        change,
        job_type,
        operation_key,
        token,
        None,
        Some(result),
    )
    .await
}

/// Releases the claim `token` after the job raised; `error` (class and message) is
/// stored in `last_error` ([`fenced`] with [`Fenced::Release`]).
pub async fn release(
    conn: &Conn,
    job_type: &str,
    operation_key: &str,
    token: Uuid,
    error: &str,
) -> Result<()> {
    fenced(
        conn,
        Fenced::Release,
        job_type,
        operation_key,
        token,
        Some(error),
    )
    .await
}

/// Reads one record, or `None` when the operation was never claimed. Sent like the
/// claim (see [`Conn::query_own`]).
///
/// Errors: connection/database errors.
pub async fn find(conn: &Conn, job_type: &str, operation_key: &str) -> Result<Option<Record>> {
    let result = conn
        .query_own(
            FIND_SQL,
            &[(&job_type, Type::TEXT), (&operation_key, Type::TEXT)],
        )
        .await;
    let Some(row) = result?.into_iter().next() else {
        return Ok(None);
    };
    Record::from_row(&row).map(Some)
}

/// Whether the operation's record is completed (see [`COMPLETED_SQL`]): one round
/// trip, nothing written.
///
/// Errors: connection/database errors.
pub async fn completed(conn: &Conn, job_type: &str, operation_key: &str) -> Result<bool> {
    let rows = conn
        .query_own(
            COMPLETED_SQL,
            &[(&job_type, Type::TEXT), (&operation_key, Type::TEXT)],
        )
        .await?;
    match rows.first() {
        Some(row) => Ok(row.try_get(0)?),
        None => Ok(false),
    }
}

/// Keys of held operations, oldest first: `(job_type, operation_key)` pairs.
pub async fn held(
    client: &Client,
    job_type: Option<&str>,
    limit: i64,
) -> Result<Vec<(String, String)>> {
    let result = client
        .query_typed(HELD_SQL, &[(&job_type, Type::TEXT), (&limit, Type::INT8)])
        .await;
    result?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// Where a purge stands: the retention-index key of the last record a batch took
/// (finish time, job type, operation key). [`PurgeCursor::default`] is the start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeCursor {
    /// The last record's finish time (`completed_at` or `given_up_at`); None at the start.
    pub finished_at: Option<DateTime<Utc>>,
    /// The last record's job type ("" at the start).
    pub job_type: String,
    /// The last record's operation key ("" at the start).
    pub operation_key: String,
}

/// What one purge batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeBatch {
    /// Records deleted.
    pub deleted: u64,
    /// Records the batch locked (all due records after the cursor, up to the batch size,
    /// but those a claim had locked). Fewer than the batch size: the purge is done.
    /// `deleted` is below it only when a picked record stopped being due meanwhile.
    pub picked: u64,
    /// Where the next batch starts (the cursor given, when nothing was picked).
    pub next: PurgeCursor,
}

/// Deletes one batch of at most `batch` finished records older than
/// `older_than_seconds`, after `after` in the retention index's order (see
/// [`PURGE_SQL`]). A purge passes each batch's [`PurgeBatch::next`] to the next batch
/// and stops when a batch picks fewer than `batch`: its time then grows with the number
/// of records deleted, not with its square. Records skipped because a claim had them
/// locked are behind the cursor: the next purge (from the start) takes them.
/// Errors: [`Error::Config`] for a negative or non-finite age or a batch below 1;
/// connection and statement errors as [`Error`].
pub async fn purge_batch(
    client: &Client,
    older_than_seconds: f64,
    batch: i64,
    after: &PurgeCursor,
) -> Result<PurgeBatch> {
    if !(older_than_seconds >= 0.0 && older_than_seconds.is_finite()) || batch < 1 {
        return Err(Error::Config(format!(
            "purge needs older_than >= 0 seconds and a batch of at least 1, got {older_than_seconds} and {batch}"
        )));
    }
    let start = after.finished_at.is_some();
    let job_type = start.then_some(after.job_type.as_str());
    let operation_key = start.then_some(after.operation_key.as_str());
    let row = client
        .query_typed(
            PURGE_SQL,
            &[
                (&older_than_seconds, Type::FLOAT8),
                (&batch, Type::INT8),
                (&after.finished_at, Type::TIMESTAMPTZ),
                (&job_type, Type::TEXT),
                (&operation_key, Type::TEXT),
            ],
        )
        .await?;
    let row = row
        .first()
        .ok_or_else(|| Error::connection("the purge statement returned no row"))?;
    let deleted: i64 = row.try_get(0)?;
    let picked: i64 = row.try_get(1)?;
    let finished_at: Option<DateTime<Utc>> = row.try_get(2)?;
    let next = match finished_at {
        Some(at) => PurgeCursor {
            finished_at: Some(at),
            job_type: row.try_get(3)?,
            operation_key: row.try_get(4)?,
        },
        None => after.clone(),
    };
    Ok(PurgeBatch {
        deleted: deleted as u64,
        picked: picked as u64,
        next,
    })
}

/// One row of [`REPEATS_SQL`].
#[derive(Debug, Clone)]
pub struct Repeated {
    pub job_type: String,
    pub operation_key: String,
    pub status: String,
    pub attempts: i32,
    pub takeovers: i32,
    pub duplicates: i32,
    pub mismatches: i32,
    pub first_claimed_at: DateTime<Utc>,
    pub repeat_times: Vec<DateTime<Utc>>,
    pub job_classes: Vec<String>,
    /// The last claiming delivery's id.
    pub jid: Option<String>,
    pub completed_at: Option<DateTime<Utc>>,
    /// The first claiming delivery's facts as JSON text, when it sent some.
    pub first_facts: Option<String>,
    /// The `repeat_facts` array as JSON text.
    pub repeat_facts: String,
}

/// Operations repeated since `since` (see [`REPEATS_SQL`]).
pub async fn repeats(
    client: &Client,
    since: DateTime<Utc>,
    job_type: Option<&str>,
) -> Result<Vec<Repeated>> {
    let rows = client
        .query_typed(
            REPEATS_SQL,
            &[(&since, Type::TIMESTAMPTZ), (&job_type, Type::TEXT)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Repeated {
                job_type: row.try_get("job_type")?,
                operation_key: row.try_get("operation_key")?,
                status: row.try_get("status")?,
                attempts: row.try_get("attempts")?,
                takeovers: row.try_get("takeovers")?,
                duplicates: row.try_get("duplicates")?,
                mismatches: row.try_get("mismatches")?,
                first_claimed_at: row.try_get("first_claimed_at")?,
                repeat_times: row.try_get("repeat_times")?,
                job_classes: row.try_get("job_classes")?,
                jid: row.try_get("jid")?,
                completed_at: row.try_get("completed_at")?,
                first_facts: row.try_get("first_facts")?,
                repeat_facts: row.try_get("repeat_facts")?,
            })
        })
        .collect()
}

/// How a person settles a held or given-up operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The effect is known to have happened: mark the operation completed.
    Done,
    /// Run it again: the record is released for the next delivery.
    Rerun,
}

/// Settles a held or given-up operation. Returns false when no such operation is
/// held or given up (never claimed, or already settled).
pub async fn resolve(
    client: &Client,
    job_type: &str,
    operation_key: &str,
    resolution: Resolution,
) -> Result<bool> {
    let name = match resolution {
        Resolution::Done => "done",
        Resolution::Rerun => "rerun",
    };
    let result = client
        .execute_typed(
            RESOLVE_SQL,
            &[
                (&job_type, Type::TEXT),
                (&operation_key, Type::TEXT),
                (&name, Type::TEXT),
            ],
        )
        .await;
    Ok(result? == 1)
}
