# frozen_string_literal: true

module IdempotentJob
  # The claim a running job holds, readable inside `perform` through
  # {IdempotentJob.current_claim} or the {IdempotentJob::Job} helpers, e.g. to pass the
  # operation key to an outside system as its reference.
  #
  # Members: job_type (String), operation_key (String), token (String, the fencing
  # token), attempt (Integer, 1 for the first claim), kind (:first, :retry, :takeover),
  # jid (String, the delivering job's id: Sidekiq's jid, ActiveJob's job_id, the plain
  # API's `jid:`; {#delivery_id} is the same under the core's and Python's name). {#in_doubt?}
  # tells whether the lease is still known to be this delivery's.
  Claim = Struct.new(:job_type, :operation_key, :token, :attempt, :kind, :jid, keyword_init: true) do
    # @return [IdempotentJob::Native::HeartbeatReader, nil] the heartbeat renewing this
    #   claim's lease while the body runs (set by {HeartbeatWatch.watch}); nil without one
    attr_accessor :heartbeat

    # The delivering job's id under the name the core, the Python package and the Rust door
    # use (`jid` is this gem's documented alias for it).
    # @return [String, nil] Sidekiq's jid, ActiveJob's job_id, or the plain API's `jid:`
    def delivery_id
      jid
    end

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
end
