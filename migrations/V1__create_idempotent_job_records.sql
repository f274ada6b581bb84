-- idempotent_job: the durable idempotency record, one row per (job type, operation key).
-- Every time in this table is written by the database clock (now()); no worker clock
-- is ever stored or compared.
CREATE TABLE idempotent_job_records (
    job_type          text             NOT NULL, -- idempotency_scope, default the job class name
    operation_key     text             NOT NULL, -- canonical operation key, readable
    status            text             NOT NULL, -- claimed | completed | released
    claim_token       uuid             NOT NULL, -- fencing token, new at every claim
    attempts          integer          NOT NULL DEFAULT 1, -- claims made so far
    takeovers         integer          NOT NULL DEFAULT 0, -- claims taken from an expired lease
    last_claim        text             NOT NULL DEFAULT 'first', -- first | retry | takeover
    jid               text,                                  -- jid of the last claiming delivery
    duplicates        integer          NOT NULL DEFAULT 0, -- deliveries turned away
    last_duplicate_at timestamptz,
    first_claimed_at  timestamptz      NOT NULL DEFAULT now(),
    claimed_at        timestamptz      NOT NULL DEFAULT now(),
    lease_seconds     double precision NOT NULL,
    lease_expires_at  timestamptz      NOT NULL,
    completed_at      timestamptz,
    released_at       timestamptz,
    last_error        text,                                  -- why the last claim was released
    updated_at        timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT idempotent_job_records_pkey PRIMARY KEY (job_type, operation_key),
    CONSTRAINT idempotent_job_records_status_check
        CHECK (status IN ('claimed', 'completed', 'released')),
    CONSTRAINT idempotent_job_records_last_claim_check
        CHECK (last_claim IN ('first', 'retry', 'takeover')),
    CONSTRAINT idempotent_job_records_lease_check CHECK (lease_seconds > 0)
);
