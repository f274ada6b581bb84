# frozen_string_literal: true

require_relative "protocol/driver"

module IdempotentJob
  # The claim protocol, queue-agnostic: one statement decides whether a delivery is
  # the first, then the block runs under a claim (or does not), and the decision comes
  # back as an {Outcome}. Doors (one per queue library, and the plain API) build a {Delivery}
  # and {JobOptions} and supply a {Door}; nothing here knows a queue.
  #
  # For one delivery:
  # * first delivery, or a retry after the block raised: run the block, then record the
  #   completion (`:ran`);
  # * already completed, held or given up: not run; the record's `duplicates` counts it;
  # * claimed by another delivery whose lease is live: not run; the door brings it back
  #   after {Outcome#retry_after} (`:in_progress`);
  # * claimed, lease expired (a stale claim): taken over; the lookup is asked, then the
  #   stale policy applies (:reclaim runs the block, :hold holds, :skip gives up).
  # While the block runs a heartbeat renews the lease. If the block raises, the claim
  # is released and the exception re-raised, unless the door calls it a crash (kept).
  # Transactional options run claim, block and completion in one transaction instead
  # ({Transactional}). Reads and writes `idempotent_job_records`.
  #
  # The steps are the core's (crates/core/src/protocol.rs, through {Driver}): Ruby
  # runs only the lookup, the block, event subscribers and the logger.
  #
  #   protocol = IdempotentJob::Protocol.new(options, door: my_door)
  #   outcome = protocol.run(delivery, host: job) { |claim| job.perform }
  class Protocol
    # @return [JobOptions]
    attr_reader :options
    # @return [Door]
    attr_reader :door

    # @param options [JobOptions] the job's resolved options
    # @param door [Door] crash rule, deferral, logger, id label
    def initialize(options, door: Door::PLAIN)
      @options = options
      @door = door
      @strategy = Transactional.for(options.transaction)
    end

    # Runs the protocol for one delivery around the block.
    # @param delivery [Delivery] what is claimed
    # @param host [Object, nil] the object a lookup method is called on (the job instance)
    # @param wait [Float, nil] seconds to wait when the claim is live (see
    #   `Native::Store#wait`: LISTEN/NOTIFY or polling, never a pooled connection held),
    #   then decide again: a completion replays, a release may run; nil: no wait
    # @yieldparam claim [Claim] the claim held (also {IdempotentJob.current_claim})
    # @return [Outcome] :ran with the block's value, or why the block did not run (a
    #   repeat of a completed operation whose completion stored a result replays it)
    # @raise [ConnectionError, TimeoutError, DatabaseError, LockTimeoutError] when the claim
    #   cannot be decided (block not run)
    # @raise [PayloadMismatchError] for a mismatched payload under `on_mismatch: :raise`
    # @raise [LookupError] when the stale-claim lookup fails (block not run)
    # @raise [LostClaimError] when the block ran but its claim had been taken over
    # @raise [Exception] what the block raised (after the release), or the door's deferral
    def run(delivery, host: nil, wait: nil, &body)
      raise ArgumentError, "Protocol#run needs a block" unless body

      # The gem's own transaction is begun, committed or rolled back by the one native call.
      return Driver.new(@options, @door, delivery, @strategy).run(request(delivery), host, wait, &body) if
        @strategy == Transactional::Native

      @strategy.within do |session|
        Driver.new(@options, @door, delivery, session).run(request(delivery), host, wait, &body)
      end
    end

    private

    # The claim request of `Native::Protocol#perform`: the delivery's fields, its
    # payload and facts as they are (the core writes their JSON and digest).
    def request(delivery)
      { job_type: delivery.job_type, operation_key: delivery.operation_key, jid: delivery.id,
        job_class: delivery.job_class, queue: delivery.queue, payload: delivery.payload, facts: delivery.facts }
    end
  end
end
