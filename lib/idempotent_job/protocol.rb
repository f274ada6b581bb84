# frozen_string_literal: true

require_relative "protocol/narrator"
require_relative "protocol/deferral"
require_relative "protocol/heartbeat"
require_relative "protocol/completion"
require_relative "protocol/step"
require_relative "protocol/lookup"
require_relative "protocol/stale_policy"
require_relative "protocol/takeover"
require_relative "protocol/mismatch"
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
    # @yieldparam claim [Claim] the claim held (also {IdempotentJob.current_claim})
    # @return [Outcome] :ran with the block's value, or why the block did not run
    # @raise [ConnectionError, TimeoutError, DatabaseError, LockTimeoutError] when the claim
    #   cannot be decided (block not run)
    # @raise [PayloadMismatchError] for a mismatched payload under `on_mismatch: :raise`
    # @raise [LookupError] when the stale-claim lookup fails (block not run)
    # @raise [LostClaimError] when the block ran but its claim had been taken over
    # @raise [Exception] what the block raised (after the release), or the door's deferral
    def run(delivery, host: nil, &body)
      raise ArgumentError, "Protocol#run needs a block" unless body

      narrator = Narrator.new(@door, delivery)
      @strategy.within do |session|
        if @options.transaction == :active_record
          run_on_active_record(session, delivery, narrator, host, &body)
        else
          Driver.new(@options, @door, narrator, session).run(request(delivery), host, &body)
        end
      end
    end

    private

    # The ActiveRecord flavour: its statements go through ActiveRecord's connection,
    # so the steps after the claim run here rather than in the core ({Driver}).
    def run_on_active_record(session, delivery, narrator, host, &)
      decision = timed { session.claim(request(delivery), @options.lock_timeout) }
      Mismatch.check!(@options, narrator, decision) if decision[:mismatch]
      case decision[:decision]
      when :claimed then claimed(session, decision, narrator, host, &)
      when :in_progress then in_progress(delivery, decision, narrator)
      else duplicate(decision, narrator)
      end
    end

    # The claim request the native store reads (see Native::Store#claim).
    def request(delivery)
      args_json, digest = ArgsDigest.json_and_digest(delivery.payload)
      { job_type: delivery.job_type, operation_key: delivery.operation_key, jid: delivery.id,
        lease: @options.lease.to_f, args_digest: digest, job_class: delivery.job_class,
        queue: delivery.queue, args_json:, refuse_mismatch: @options.on_mismatch == :raise,
        facts_json: delivery.facts_json }
    end

    # Runs the block (a claim) and adds its duration in seconds to the decision (a
    # Hash of the claim's own, so it is changed in place).
    def timed
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      decision = yield
      decision[:duration] = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      decision
    end

    def claimed(session, decision, narrator, host, &body)
      delivery = narrator.delivery
      claim = Claim.new(job_type: delivery.job_type, operation_key: delivery.operation_key, token: decision[:token],
                        attempt: decision[:attempt], kind: decision[:kind], jid: delivery.id)
      narrator.emit(:claimed, claim, kind: claim.kind, duration: decision[:duration])
      narrator.emit(:taken_over, claim) if claim.kind == :takeover
      IdempotentJob.with_claim(claim) do
        verdict = claim.kind == :takeover ? Takeover.new(@options, session, narrator).decide(claim, host) : :ran
        next Outcome.new(verdict, claim:) unless verdict == :ran

        narrator.info { "claimed #{narrator.describe_claim(claim)} again after a failure" } if claim.kind == :retry
        Outcome.new(:ran, value: session.run(claim, @options, narrator) { body.call(claim) }, claim:)
      end
    end

    def in_progress(delivery, decision, narrator)
      remaining = decision[:lease_remaining]
      delay = Deferral.delay(remaining, delivery.deferrals)
      outcome = Outcome.new(:in_progress, retry_after: delay, lease_remaining: remaining, holder: decision[:holder_jid])
      @door.defer(delivery, outcome)
      narrator.info do
        "#{narrator.describe} is in progress under #{@door.id_label} #{decision[:holder_jid]}; " \
          "#{@door.defer_text} #{delay.round(1)} s (deferral #{delivery.deferrals + 1}; its lease ends " \
          "in #{remaining.round(1)} s)"
      end
      narrator.emit_delivery(:deferred, delay:, holder_jid: decision[:holder_jid])
      outcome
    end

    # How the log line names the state a duplicate met.
    DUPLICATE_STATES = { completed: "already completed", held: "held for a person", given_up: "given up",
                         refused: "not claimable by this payload" }.freeze
    private_constant :DUPLICATE_STATES

    def duplicate(decision, narrator)
      state = DUPLICATE_STATES.fetch(decision[:decision])
      narrator.info { "#{narrator.describe} is #{state}; duplicate delivery skipped (#{decision[:duplicates]} so far)" }
      narrator.emit_delivery(:skipped, decision: decision[:decision], duplicates: decision[:duplicates])
      Outcome.new(decision[:decision], duplicates: decision[:duplicates])
    end
  end
end
