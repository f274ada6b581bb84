# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Runs one delivery through the core protocol (`Native::Protocol`): the core claims,
    # decides, applies the stale policy, completes (with its retries) and releases; this
    # class only runs user code between its calls (the lookup, the body) and tells what
    # the core noted (events through {Events}, log lines through the door's logger).
    # Used for the pool (no transaction), the gem's own transactions
    # (`transaction: true`) and ActiveRecord's (`transaction: :active_record`). Internal.
    class Driver
      # Native protocols by job options (the cached, frozen JobOptions object); each
      # keeps itself told in the words of the doors it ran for (see `Native::Protocol`).
      @natives = {}.compare_by_identity
      @natives_lock = Mutex.new
      # Most job options kept (per-push overrides add option sets).
      NATIVES_LIMIT = 1000
      # Kernel#class and Module#name, called on what a delivery raised (see {.class_name}).
      CLASS_OF = Kernel.instance_method(:class)
      NAME_OF = Module.instance_method(:name)

      class << self
        # The native protocol of `options` (built once; readers never lock: a Hash
        # compared by identity is changed without running Ruby code).
        # @param options [JobOptions]
        # @return [Native::Protocol]
        # @raise [ConfigurationError] for an option the core refuses
        def native(options)
          @natives[options] || @natives_lock.synchronize do
            @natives = {}.compare_by_identity if @natives.size >= NATIVES_LIMIT
            @natives[options] ||= Native::Protocol.new(options.name, options.settings,
                                                       IdempotentJob.configuration.defer_margin.to_f)
          end
        end

        # Whether a body running in this thread (or fiber) holds the claim of
        # (`job_type`, `operation_key`), however deeply nested.
        # @return [Boolean]
        def held?(job_type, operation_key)
          held = Thread.current[:idempotent_job_held]
          !held.nil? && held.any? { |claim| claim.job_type == job_type && claim.operation_key == operation_key }
        end

        # The name of `error`'s class as Ruby's error printer reads it: no method of the
        # error or its class runs (a `name` or `class` that raises cannot replace it).
        # @param error [Exception]
        # @return [String, nil] nil for an anonymous class
        def class_name(error)
          NAME_OF.bind_call(CLASS_OF.bind_call(error))
        end

        # Runs the block with `claim` among the claims this thread's bodies hold.
        # @param claim [Claim]
        # @return [Object] the block's value
        def holding(claim)
          held = (Thread.current[:idempotent_job_held] ||= [])
          held.push(claim)
          yield
        ensure
          held&.pop
        end
      end

      # @param options [JobOptions]
      # @param door [Door]
      # @param delivery [Delivery] the delivery run (its log lines go to the door's logger)
      # @param session [Transactional::Direct, Class<Transactional::Native>, Transactional::ActiveRecord]
      #   where the statements go (the gem's own transaction is opened by the native call)
      def initialize(options, door, delivery, session)
        @options = options
        @door = door
        @delivery = delivery
        @native = self.class.native(options)
        @session = session
      end

      # Runs the delivery in one native call (`Native::Protocol#perform`), which calls
      # back this object for user code: {#lookup}, {#body}, {#encode}, {#tell}.
      # @param request [Hash] the claim request (see `claim_request` in ext/idempotent_job/src/ruby/convert.rs)
      # @param host [Object, nil] the object a lookup method is called on
      # @param wait [Float, nil] seconds to wait for a live claim to end (pool only)
      # Publishes the `delivered` event at the end, raising or not (see {#delivered}).
      # @yieldparam claim [Claim]
      # @return [Outcome]
      # @raise see {Protocol#run}
      def run(request, host, wait = nil, &)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        begin
          outcome = perform(request, host, wait, &)
        rescue Exception => e # rubocop:disable Lint/RescueException -- told to subscribers, then raised unchanged
          delivered(started, error: e)
          raise
        end
        delivered(started, outcome:)
        outcome
      end

      # The one native call of {#run} (same parameters, return value and errors).
      def perform(request, host, wait, &body)
        @host = host
        @body = body
        # A delivery nested in the body of the same operation would wait for its own claim.
        wait = nil if wait && Driver.held?(request[:job_type], request[:operation_key])
        kind, value, notes = @native.perform(IdempotentJob.store, channel, request, @door,
                                             @delivery.deferrals, wait, self)
        return in_progress(value, notes) if kind == :in_progress

        tell(notes)
        kind == :error ? raise_error(value) : Outcome.new(kind, **value)
      end

      # The lookup's answer for `operation_key` (called by the core for a stale claim
      # under `on_stale: :lookup`): `[:answered, value]`, which the core parses (one of
      # {JobOptions::LOOKUP_ANSWERS} as a Symbol or String; anything else is invalid,
      # named by its `inspect`), or `[:raised, "Class: message"]` (the error kept as the
      # LookupError's cause).
      # @param operation_key [String]
      # @return [Array(Symbol, Object)]
      def lookup(operation_key)
        lookup = @options.lookup
        answer = if lookup.respond_to?(:call)
                   lookup.call(operation_key)
                 elsif @host.nil?
                   raise ConfigurationError, "#{@options.name}: #{@options.lookup_label} needs the job object, " \
                                             "none was given"
                 else
                   @host.public_send(lookup, operation_key)
                 end
        [:answered, answer]
      rescue StandardError => e
        @lookup_failure = e
        [:raised, Events.described(e)] # a #message that raises cannot replace the lookup's error
      end

      # Runs the block under the claim (called by the core once it holds the claim and
      # watches its heartbeat).
      # @param claim [Claim] the claim held
      # @param transaction [Native::Transaction, nil] the gem's transaction the body
      #   writes through (`transaction: true`)
      # @return [Object] the block's value
      # @raise [Exception] what the block raised (the core asks the door whether it is a
      #   crash, then releases or keeps the claim)
      def body(claim, transaction = nil)
        Driver.holding(claim) do
          IdempotentJob.with_claim(claim) do
            next @body.call(claim) unless transaction

            IdempotentJob.with_transaction(IdempotentJob::Transaction.new(transaction)) { @body.call(claim) }
          end
        end
      end

      # `[json, nil]` for a value to store, or `[nil, why JSON cannot carry it]`.
      def encode(value) = ResultJson.encode(value)

      # Raises the job's error for an operation key the core refuses (called by the core
      # before anything is claimed).
      # @param problem [String] the core's words for what is wrong with the key
      # @raise [OperationKeyError] naming the job and the problem
      def refuse_key(problem)
        Key.refuse!(@options.name, problem, @options.key&.declaration, job_type: @options.scope)
      end

      private

      # The channel `Native::Protocol#perform` sends the statements on: nil (the pool),
      # the gem's transaction, or ActiveRecord's session.
      def channel
        return :transaction if @session == Transactional::Native

        @session.is_a?(Transactional::Direct) ? nil : @session
      end

      # Publishes `delivered` (one per delivery that reached the core, when listened):
      # job_type, operation_key, jid, door, duration (seconds, the whole delivery), and
      # outcome (the core's label, {Outcome#label}) or error (the class name of what the
      # delivery raised; outcome nil).
      def delivered(started, outcome: nil, error: nil)
        return unless Events.listened?(:delivered)

        delivery = @delivery
        Events.publish(:delivered, job_type: delivery.job_type, operation_key: delivery.operation_key,
                                   jid: delivery.id, door: @door.name, outcome: outcome&.label,
                                   error: error && Driver.class_name(error),
                                   duration: Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      end

      # The core's error or what the body raised; a failed lookup's own error is the
      # LookupError's cause.
      def raise_error(error)
        raise error, cause: @lookup_failure if @lookup_failure && error.is_a?(LookupError)

        raise error
      end

      def in_progress(value, notes)
        outcome = Outcome.new(:in_progress, **value)
        deferred, before = notes.partition { |note| note[0] == :deferred }
        tell(before)
        # Before the deferral is told: a door that cannot bring the delivery back raises.
        @door.defer(@delivery, outcome)
        tell(deferred)
        outcome
      end

      public

      # Tells the core's notes: events to their listeners, lines to the door's logger.
      def tell(notes)
        delivery = @delivery
        notes.each do |event, details, level, text, attempt|
          if event && Events.listened?(event)
            payload = { job_type: delivery.job_type, operation_key: delivery.operation_key, jid: delivery.id }
            payload[:attempt] = attempt if attempt
            Events.publish(event, payload.merge!(details))
          end
          say(level, text) if level
        end
      end

      private

      # Interrupts held while a ::Logger writes (see {#say}).
      HOLD_INTERRUPTS = { Object => :never }.freeze

      # Logs `text` at `level` with the gem's prefix through the door's logger. A
      # ::Logger swallows any exception raised while it writes (`rescue Exception` in its
      # device), so an interrupt that arrives meanwhile (a signal, Thread#raise, Timeout)
      # is held until the line is written and raised then, instead of being lost.
      # @param level [Symbol] :info, :warn or :error
      # @param text [String] the core's words (job type, operation key, delivery id)
      # @return [void]
      def say(level, text)
        out = @door.logger
        return Thread.handle_interrupt(HOLD_INTERRUPTS) { out.public_send(level) { "idempotent_job: #{text}" } } if
          out.is_a?(::Logger)

        out.public_send(level, "idempotent_job: #{text}")
      end
    end
  end
end
