-- idempotent_job: retention, keyset. Purge walks finished records in the order
-- (finish time, job type, operation key) and each batch starts after the last record the
-- previous one took, so no batch reads the index entries of records earlier batches
-- deleted. The primary key in the index makes that order total (many records can share
-- a finish time). It replaces V3's index, whose every use this one serves.
CREATE INDEX idempotent_job_records_retention_idx
    ON idempotent_job_records ((coalesce(completed_at, given_up_at)), job_type, operation_key)
    WHERE status IN ('completed', 'given_up');
DROP INDEX idempotent_job_records_finished_idx;
