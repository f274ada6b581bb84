-- idempotent_job: a HOT completion. PostgreSQL updates a row in place (a heap-only
-- tuple, no index entry written) only when no index covers a column the update changes
-- — columns in an index's predicate count. The completion changes status and
-- completed_at, which V2's held index (WHERE status = 'held') and V9's retention index
-- (coalesce(completed_at, given_up_at), WHERE status IN …) both cover, so every
-- completion wrote a new entry in the primary key and the retention index.
--
-- Purge now walks first_claimed_at, which nothing changes after the first claim: a
-- record finishes after it is first claimed, so every record finished before the
-- cutoff is among those first claimed before it, and the purge filters the finish time
-- as it walks (keyset-paged on (first_claimed_at, job_type, operation_key)). Held
-- operations are listed through held_at, which only a hold sets (a record once held
-- keeps its held_at; the listing filters the status). A fillfactor of 80 leaves room
-- in each page for the updated versions; it applies to pages written from now on.
--
-- Locks: CREATE INDEX holds writes to the table (SHARE lock) while it builds (measured
-- in docs/benchmarks.md on 1M records); DROP INDEX and SET (fillfactor) take an
-- ACCESS EXCLUSIVE lock for an instant.
CREATE INDEX idempotent_job_records_first_claimed_idx
    ON idempotent_job_records (first_claimed_at, job_type, operation_key);
CREATE INDEX idempotent_job_records_ever_held_idx
    ON idempotent_job_records (held_at, job_type, operation_key) WHERE held_at IS NOT NULL;
DROP INDEX idempotent_job_records_retention_idx;
DROP INDEX idempotent_job_records_held_idx;
ALTER TABLE idempotent_job_records SET (fillfactor = 80);
