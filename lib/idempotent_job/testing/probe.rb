# frozen_string_literal: true

module IdempotentJob
  # See lib/idempotent_job/testing.rb.
  module Testing
    # What one delivery made by the kit did.
    #
    # Members: label (String, e.g. "delivery 2", "worker 3 (process)"), jid (String),
    # outcome (Symbol: :ran — the body ran and returned; :raised — it raised; :deferred
    # — in progress elsewhere, pushed back; :skipped — already completed/held/given up;
    # :held, :given_up — a stale claim the policy did not run; :killed — the worker was
    # SIGKILLed by the kit; :not_run — none of these), ran (Boolean, the body returned,
    # or the kit killed it after its effect), decision (Symbol or nil, what the claim
    # found: :first, :retry, :takeover, :completed, :held, :given_up…), lookup (Symbol
    # or nil, the stale-claim lookup's answer), error (String or nil, "Class: message"),
    # deferred (Array<Hash>, payloads the gem pushed back for later).
    Delivery = Struct.new(:label, :jid, :outcome, :ran, :decision, :lookup, :error, :deferred,
                          keyword_init: true) do
      # @return [String] one line, e.g. "delivery 2 (jid 3f…): skipped (completed)"
      def to_s
        detail = [decision, (lookup && "lookup #{lookup}"), error].compact.join(", ")
        "#{label} (jid #{jid}): #{outcome}#{" (#{detail})" unless detail.empty?}"
      end
    end

    # Collects, for the delivery running on the current thread, the gem's events and
    # whether the body ran. Internal to the kit.
    class Recorder
      attr_reader :delivery

      # @param delivery [Delivery] filled in as the delivery goes
      def initialize(delivery)
        @delivery = delivery
        @delivery.deferred ||= []
      end

      # @return [Recorder, nil] the recorder of the delivery running on this thread
      def self.current
        Thread.current[:idempotent_job_testing]
      end

      # Runs the block with this recorder attached to the current thread.
      def attach
        before = Thread.current[:idempotent_job_testing]
        Thread.current[:idempotent_job_testing] = self
        yield
      ensure
        Thread.current[:idempotent_job_testing] = before
      end

      # @param name [Symbol] an {IdempotentJob::Events} name
      # @param payload [Hash] its payload
      def event(name, payload)
        case name
        when :claimed then @delivery.decision = payload[:kind]
        when :skipped then skipped(payload)
        when :deferred then @delivery.outcome = :deferred
        when :held, :given_up then @delivery.outcome = name
        when :lookup then @delivery.lookup = payload[:answer]
        end
      end

      # Keeps a copy the door deferred (to be delivered later by the kit).
      # @param payload [Hash]
      # @return [void]
      def deferred!(payload)
        @delivery.deferred << payload
      end

      # Notes that the body ran (returned, or reached the effect point of a worker the
      # kit kills): outcome :ran.
      # @return [void]
      def ran!
        @delivery.ran = true
        @delivery.outcome = :ran
      end

      # Notes that the delivery raised: outcome :raised, error "Class: message".
      # @param error [Exception] what it raised
      # @return [void]
      def raised!(error)
        @delivery.outcome = :raised
        @delivery.error = "#{error.class}: #{error.message}"
      end

      private

      def skipped(payload)
        @delivery.outcome = :skipped
        @delivery.decision = payload[:decision]
      end
    end

    # Innermost layer of the kit's deliveries (a Sidekiq server middleware, or
    # {Probe.around} called by a door's kit subject around the body): notes that the body ran,
    # and in a worker the kit is about to kill, stops it at the chosen point (right
    # after the claim, before the body; or after the body, before the completion is
    # recorded) until the SIGKILL arrives.
    class Probe
      class << self
        # @return [Symbol, nil] :claim or :effect in a worker that is to be killed
        attr_accessor :stop_at
        # @return [IO, nil] where the stopped worker tells the kit it is there
        attr_accessor :signal
        # @return [Numeric, nil] seconds a body that ran waits before its completion
        #   is recorded, so that concurrent deliveries overlap it
        attr_accessor :hold
      end

      # Called in a worker to be killed: writes the point to the kit, then waits for
      # the SIGKILL (at most a minute, then exits without a word).
      # @param point [Symbol] :claim or :effect
      # @return [void]
      def self.stop!(point)
        Recorder.current&.ran! if point == :effect
        signal.puts("stopped #{point}")
        sleep 60
        exit!(3)
      end

      # Runs the body (inside the claim): stops a worker to be killed at its point,
      # notes that the body ran, and holds the claim for {hold} seconds.
      # @yield the body
      # @return [Object] the body's value
      def self.around
        stop!(:claim) if stop_at == :claim
        result = yield
        stop!(:effect) if stop_at == :effect
        Recorder.current&.ran!
        sleep(hold) if hold
        result
      end

      # As a Sidekiq server middleware: {Probe.around} the rest of the chain.
      # @param _worker [Object] the job instance
      # @param _job [Hash] the payload
      # @param _queue [String]
      # @return [Object] the body's value
      def call(_worker, _job, _queue, &)
        Probe.around(&)
      end
    end

    # The gem's events reach the recorder of the delivery on the same thread.
    Events.subscribe { |name, payload| Recorder.current&.event(name, payload) }
  end
end
