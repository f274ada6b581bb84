-- idempotent_job: what the repeats report reads. Kept by the claim statement itself,
-- so a duplicate's decision stays one statement.
ALTER TABLE idempotent_job_records
    ADD COLUMN repeat_times timestamptz[] NOT NULL DEFAULT '{}', -- the last 20 repeated deliveries
    ADD COLUMN job_classes  text[]        NOT NULL DEFAULT '{}'; -- every job class that delivered it

UPDATE idempotent_job_records SET job_classes = ARRAY[job_class] WHERE job_class IS NOT NULL;
