# frozen_string_literal: true

require "digest/sha2" # loaded eagerly: Digest's lazy autoload is not thread-safe
require "json"

module IdempotentJob
  # The claim a running job holds, readable inside `perform` through
  # {IdempotentJob.current_claim} or the {IdempotentJob::Job} helpers, e.g. to pass the
  # operation key to an outside system as its reference.
  #
  # Members: job_type (String), operation_key (String), token (String, the fencing
  # token), attempt (Integer, 1 for the first claim), kind (:first, :retry, :takeover),
  # jid (String, the delivering job's id). {#in_doubt?} tells whether the lease is still
  # known to be this delivery's.
  Claim = Struct.new(:job_type, :operation_key, :token, :attempt, :kind, :jid, keyword_init: true) do
    # @return [IdempotentJob::Native::Heartbeat, nil] the heartbeat renewing this claim's
    #   lease while the body runs (set by {HeartbeatWatch.watch}); nil without one
    attr_accessor :heartbeat

    # Whether this delivery may no longer hold the operation: its heartbeat found the
    # claim taken over, its last lease renewal failed (the database unreachable, a
    # failover), or no renewal was confirmed for two thirds of the lease. A long job
    # can check it before an effect that must not happen twice, and stop (raise) rather
    # than race the delivery that may take over when the lease runs out.
    # @return [Boolean] false without a heartbeat (`idempotency_heartbeat: false`)
    def in_doubt?
      heartbeat ? heartbeat.report[:in_doubt] : false
    end
  end

  # Helpers for job classes, included automatically into every job class that the
  # middleware runs with a claim. Inside `perform`:
  #
  #   def perform(order_id, amount_cents)
  #     Gateway.charge(amount_cents, reference: idempotency_key, attempt: idempotency_attempt)
  #   end
  module Job
    # @return [IdempotentJob::Claim, nil] the claim of the running delivery, nil outside one
    def idempotency_claim
      IdempotentJob.current_claim
    end

    # @return [String, nil] the operation key of the running delivery
    def idempotency_key
      idempotency_claim&.operation_key
    end

    # @return [Integer, nil] the claim's attempt: 1 for the first, more after a retry or takeover
    def idempotency_attempt
      idempotency_claim&.attempt
    end

    # @return [IdempotentJob::Transaction, nil] the handle of a job declared with
    #   `idempotency_transaction: true`: its statements commit with the claim and the
    #   completion (nil for other jobs)
    def idempotent_transaction
      IdempotentJob.current_transaction
    end
  end

  # The digest of a job's arguments stored with each claim, to notice a later delivery
  # with the same operation key but different arguments (a payload mismatch).
  module ArgsDigest
    # @param args [Array] the job's arguments
    # @return [String] hex SHA-256 of their canonical JSON (Hash keys as strings, sorted)
    def self.of(args)
      ::Digest::SHA256.hexdigest(JSON.generate(canonical(args)))
    end

    def self.canonical(value)
      case value
      when Hash then value.map { |k, v| [k.to_s, canonical(v)] }.sort_by(&:first).to_h
      when Array then value.map { |v| canonical(v) }
      when Symbol then value.to_s
      else value
      end
    end
  end
end
