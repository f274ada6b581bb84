-- idempotent_job: retention. Purge finds finished records by the time they finished.
CREATE INDEX idempotent_job_records_finished_idx
    ON idempotent_job_records ((coalesce(completed_at, given_up_at)))
    WHERE status IN ('completed', 'given_up');
