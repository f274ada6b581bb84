-- idempotent_job: no CHECK constraints on the record table. Every value they checked is
-- a literal of the core's own statements (status, last_claim, result_state) or
-- validated by the core before it is sent (the lease in seconds, > 0), and they cost
-- every writing statement ≈ 20–25 µs of server time on PostgreSQL 15 (a first
-- delivery's claim 69–72 µs with them, 45–49 without; its completion 43–46 against 23):
-- measured in docs/benchmarks.md (cost per operation), reasoning in docs/design.md.
--
-- Lock: ALTER TABLE … DROP CONSTRAINT changes the catalog only (no scan, no rewrite);
-- it takes an ACCESS EXCLUSIVE lock on the table for that instant (6.4 ms on a table of
-- 1M records). Like any ALTER TABLE it first waits for transactions that hold a lock on
-- the table (a same-database transactional claim holds its row until its job's
-- transaction ends), and deliveries arriving meanwhile wait behind it.
ALTER TABLE idempotent_job_records
    DROP CONSTRAINT IF EXISTS idempotent_job_records_status_check,
    DROP CONSTRAINT IF EXISTS idempotent_job_records_last_claim_check,
    DROP CONSTRAINT IF EXISTS idempotent_job_records_lease_check,
    DROP CONSTRAINT IF EXISTS idempotent_job_records_result_state_check;
