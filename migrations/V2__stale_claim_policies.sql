-- idempotent_job: stale-claim policies, payload digests, held operations, heartbeats.
ALTER TABLE idempotent_job_records
    DROP CONSTRAINT idempotent_job_records_status_check,
    ADD CONSTRAINT idempotent_job_records_status_check
        CHECK (status IN ('claimed', 'completed', 'released', 'held', 'given_up')),
    ADD COLUMN args_digest   text,     -- SHA-256 of the claiming delivery's canonical arguments
    ADD COLUMN job_class     text,     -- the claiming delivery's job class, queue and arguments:
    ADD COLUMN queue         text,     --   what `resolve(as: :rerun)` re-enqueues
    ADD COLUMN args          jsonb,
    ADD COLUMN mismatches    integer NOT NULL DEFAULT 0,     -- deliveries whose arguments differed
    ADD COLUMN last_mismatch boolean NOT NULL DEFAULT false, -- did the latest delivery's differ?
    ADD COLUMN heartbeat_at  timestamptz,                    -- last lease renewal
    ADD COLUMN held_at       timestamptz,                    -- :hold policy: waiting for a person
    ADD COLUMN given_up_at   timestamptz,                    -- :skip policy: a rare miss
    ADD COLUMN resolution    text,                           -- done | rerun, set by resolve
    ADD COLUMN resolved_at   timestamptz;

CREATE INDEX idempotent_job_records_held_idx
    ON idempotent_job_records (held_at) WHERE status = 'held';
