-- idempotent_job: the first claiming delivery's facts (the door's facts: delivery id,
-- producer, enqueue time…), written by the first claim's insert and never changed, so
-- the repeats report can tell a repeat of the same delivery or producer from another.
ALTER TABLE idempotent_job_records
    ADD COLUMN first_facts jsonb;
