//! The bookkeeping of repeated deliveries, off the decision's path.
//!
//! A duplicate answered by the read-only look ((`claim::deliver`)) changes
//! nothing durable. What the repeats report needs about it (`duplicates`,
//! `last_duplicate_at`, `mismatches`, `repeat_times`, `job_classes`, and one
//! `repeat_facts` entry per repeat) is queued here and written by the background
//! runtime, batched, in ONE statement per batch ([`FLUSH_SQL`](crate::sql::FLUSH_SQL)) committed with
//! `synchronous_commit = off`. Repeats decided by the claim statement itself
//! (retries, takeovers, a duplicate that raced the first claim) already counted
//! themselves durably; only their `repeat_facts` entry is queued.
//!
//! Concurrency: batches of many processes meet the same rows, and a job's open
//! transaction (the ActiveRecord or native transaction modes) holds its record's row
//! until it ends. A batch never waits for a row lock: [`FLUSH_SQL`](crate::sql::FLUSH_SQL) skips the rows
//! another transaction holds right now and names them; their repeats stay queued and
//! are sent again on a later batch ([`LOCKED_ROW_PATIENCE`] at most). So the writer
//! never waits on an application's transaction, and batches never deadlock. A batch
//! PostgreSQL still refuses with a transient error (a serialization failure, a
//! read-only server in a failover, a statement timeout) was rolled back and is kept
//! and written again, merged with what was queued since, never dropped.
//!
//! A repeat whose claim ran in a transaction is queued by the native call that made
//! the claim, while that transaction is still open: at its commit (the native
//! session's `Session::commit`), or when the delivery's one native
//! call ends without an error (a transaction on another driver, Ruby's ActiveRecord:
//! it commits right after). Its row is locked until the transaction ends, so the
//! batches skip it until then. In the second case the repeat carries the claim's
//! transaction id ([`Repeat::xid`]): its `repeat_facts` entry is written
//! ([`FLUSH_AWAITING_SQL`](crate::sql::FLUSH_AWAITING_SQL)) only once that transaction committed, and let go if it rolled
//! back after the call (a raising event subscriber, a failed `COMMIT`), since the claim's
//! counting was rolled back with it.
//!
//! What can be lost (telemetry only, never a decision: the decision is the record's
//! status and claim token, which only the durable claim and fenced statements
//! change):
//! * a process killed (SIGKILL, OOM) loses the repeats queued and not yet written:
//!   those of the batch being gathered ([`LINGER`]) and of the batch being written
//!   (measured: docs/design.md, "Repeat bookkeeping: what a crash can lose");
//! * a PostgreSQL crash loses the batches committed within `wal_writer_delay`
//!   (200 ms by default) before it;
//! * a repeat whose row stays locked by other transactions for longer than
//!   [`LOCKED_ROW_PATIENCE`] is dropped and counted ([`Bookkeeper::dropped`]);
//! * a batch whose connection is lost (or whose deadline passes) after it was sent
//!   is dropped: it may have been written, and sending it again could count it
//!   twice; so is a batch refused for good (no record table), and a repeat of a new
//!   operation while [`MAX_QUEUED_OPERATIONS`] are queued. [`Bookkeeper::dropped`]
//!   counts them.
//!
//! Within one process, reads see their own repeats: [`Bookkeeper::settle`] writes
//! what is queued (and waits for a batch in flight) before `find`/`repeats` read
//! (all but the `repeat_facts` entries of rows another transaction holds for longer than
//! [`FACTS_ONLY_PATIENCE`]), and
//! a delivery whose operation still has a repeat queued settles first, so sequential
//! deliveries of one operation count exactly.
//!
//! By concern: `repeat` ([`Repeat`], one repeated delivery), `pending` (an operation's
//! merged repeats and the queue), `batch` (a batch's parameters and what the statement
//! left out), `writer` ([`Bookkeeper`]: the queue, the background writer, the limits).

mod batch;
mod pending;
mod repeat;
mod writer;

pub use repeat::Repeat;
pub use writer::{
    Bookkeeper, FACTS_ONLY_PATIENCE, LINGER, LOCKED_ROW_PATIENCE, MAX_QUEUED_OPERATIONS,
};
