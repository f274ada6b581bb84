# frozen_string_literal: true

require "pg"
require "sidekiq"
require "idempotent_job"
require_relative "stand_in"

# The soak and chaos run (bin/soak): real `sidekiq` processes fed many operations and
# duplicate deliveries while workers are SIGKILLed and PostgreSQL restarts, then every
# operation checked against the database and the stand-in outside service. This file
# holds what the workers and the driver share: the settings passed through the
# environment and the four job types.
module Soak
  # The one queue of the soak's jobs.
  QUEUE = "soak"
  # Sidekiq retries of a failed delivery (a connection error while PostgreSQL restarts).
  RETRIES = 25

  class << self
    # @return [Float] lease of every soak job, seconds (SOAK_LEASE; short, so that stale
    #   claims of killed workers are taken over within the run)
    def lease
      Float(ENV.fetch("SOAK_LEASE", "6"))
    end

    # @return [Float] the longest pause, seconds, a job body makes before and again after
    #   its effect (SOAK_WORK_MS), so that kills land before, during and after effects
    def work_seconds
      Float(ENV.fetch("SOAK_WORK_MS", "200")) / 1000
    end

    # @return [String] this worker process's id, "w<slot>-<incarnation>" (SOAK_WORKER_ID);
    #   unique for the whole run, unlike a pid
    def worker_id
      ENV.fetch("SOAK_WORKER_ID", "driver")
    end

    # Sleeps a random time between 0 and {work_seconds}: the job's own work.
    # @return [void]
    def work
      sleep(rand * work_seconds)
    end

    # @return [String] the reference of an operation at the stand-in outside service and in
    #   the soak's journal: "<job type>/<operation key>"
    def reference(job_type, operation_key)
      "#{job_type}/#{operation_key}"
    end
  end

  # Sidekiq options every soak job shares: its queue, and quick retries (1 s, 2 s, … plus
  # Sidekiq's jitter) so a delivery that failed while PostgreSQL restarted comes back
  # within the run.
  module Retried
    # @param base [Class] a Sidekiq job class
    # @return [void]
    def self.included(base)
      base.sidekiq_options queue: QUEUE, retry: RETRIES
      base.sidekiq_retry_in { |count, _error| 1 + count }
    end
  end

  # An operation whose effect is outside the database: a call to the stand-in service,
  # which counts calls per reference (as a payment provider or mail service would keep
  # its own log). The effect carries the claim's fencing token, its attempt and this
  # worker's id, so the checker can tell which claim made each call.
  class OutsideEffectJob
    include ::Sidekiq::Job
    include IdempotentJob::Job
    include Retried

    # @param operation_key [String] the operation key (also the stand-in's reference)
    # @param _amount_cents [Integer] part of the payload, identical in every delivery
    # @return [void]
    # @raise [StandIn::Error] when the stand-in cannot be reached (Sidekiq retries)
    def perform(operation_key, _amount_cents)
      Soak.work
      claim = idempotency_claim
      reference = Soak.reference(self.class.name, operation_key)
      StandIn::Client.from_env.effect(reference:, worker: Soak.worker_id, token: claim&.token,
                                      attempt: claim&.attempt, jid:)
      Thread.current[:soak_effect] = { token: claim&.token, attempt: claim&.attempt }
      Soak.work
    end
  end

  # Outside effect, `idempotency_on_stale: :reclaim`: a stale claim is run again.
  class ReclaimJob < OutsideEffectJob
    sidekiq_options idempotency_key: :operation_key, idempotency_on_stale: :reclaim
  end

  # Outside effect, `idempotency_on_stale: :hold`: a stale claim waits for a person.
  class HoldJob < OutsideEffectJob
    sidekiq_options idempotency_key: :operation_key, idempotency_on_stale: :hold
  end

  # Outside effect, `idempotency_on_stale: :skip`: a stale claim is given up.
  class SkipJob < OutsideEffectJob
    sidekiq_options idempotency_key: :operation_key, idempotency_on_stale: :skip
  end

  # An effect in the same database: a row in soak_ledger (no unique constraint, so a
  # second run would be a second row), written in the job's idempotent transaction with
  # the claim and the completion.
  class LedgerJob
    include ::Sidekiq::Job
    include IdempotentJob::Job
    include Retried
    sidekiq_options idempotency_key: :operation_key, idempotency_transaction: true

    # The ledger table, created by the driver in the soak's database.
    TABLE_SQL = <<~SQL
      CREATE TABLE IF NOT EXISTS soak_ledger (
          operation_key text        NOT NULL,
          amount_cents  integer     NOT NULL,
          worker        text        NOT NULL,
          created_at    timestamptz NOT NULL DEFAULT now()
      )
    SQL

    # The ledger row.
    INSERT_SQL = "INSERT INTO soak_ledger (operation_key, amount_cents, worker) VALUES ($1, $2, $3)"

    # @param operation_key [String] the operation key
    # @param amount_cents [Integer] the amount booked
    # @return [void]
    # @raise [IdempotentJob::Error] when the write fails (everything rolls back; Sidekiq retries)
    def perform(operation_key, amount_cents)
      Soak.work
      params = [operation_key, amount_cents, Soak.worker_id]
      if idempotent_transaction
        idempotent_transaction.exec(INSERT_SQL, params)
      else
        control_write(params)
      end
      Soak.work
    end

    private

    # The control run (bin/soak --control): the same write without the gem, on a
    # connection of this thread's own (dropped when it fails, e.g. across the restart).
    def control_write(params)
      (Thread.current[:soak_pg] ||= PG.connect(ENV.fetch("DATABASE_URL"))).exec_params(INSERT_SQL, params)
    rescue PG::Error
      Thread.current[:soak_pg]&.close
      Thread.current[:soak_pg] = nil
      raise
    end
  end

  # Job classes of the soak, each with how its effect is made and checked.
  JOB_TYPES = {
    "Soak::LedgerJob" => :transaction, "Soak::ReclaimJob" => :reclaim, "Soak::HoldJob" => :hold,
    "Soak::SkipJob" => :skip
  }.freeze
end
