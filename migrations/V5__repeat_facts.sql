-- idempotent_job: one entry per repeated delivery (the last 20), written off the decision's
-- path by the asynchronous bookkeeping: {"at": database time of the decision, "job_class",
-- "decision", "facts": the door's delivery facts (a JSON object) or null}.
ALTER TABLE idempotent_job_records
    ADD COLUMN repeat_facts jsonb NOT NULL DEFAULT '[]';
