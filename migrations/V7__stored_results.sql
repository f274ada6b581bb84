-- idempotent_job: stored results (replays). A completion made with store_result keeps
-- the body's return value as JSON in `result`, and says in `result_state` what became
-- of it: 'stored', or why it was not ('too_large', 'unencodable'). Both stay NULL for a
-- completion that stored nothing (no store requested) and for every existing record.
-- They are columns of the record, so purge removes a result with its record.
ALTER TABLE idempotent_job_records
    ADD COLUMN result jsonb,
    ADD COLUMN result_state text
        CONSTRAINT idempotent_job_records_result_state_check
        CHECK (result_state IN ('stored', 'too_large', 'unencodable'));
