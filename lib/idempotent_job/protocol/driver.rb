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
      # Native protocols, by job options (the cached, frozen JobOptions object) and then
      # by door words (built once each).
      @natives = {}.compare_by_identity
      @natives_lock = Mutex.new
      # Most job options kept (per-push overrides add option sets).
      NATIVES_LIMIT = 1000

      class << self
        # The native protocol of `options` told in `door`'s words.
        # @param options [JobOptions]
        # @param door [Door]
        # @return [Array(Native::Protocol, Hash)] the protocol and the words it was built with
        # @raise [ConfigurationError] for an option the core refuses
        def native(options, door)
          key = [door.id_label, door.defer_text, door.crash_text]
          found = @natives[options]&.[](key)
          return found if found

          words = { id_label: key[0], defer_text: key[1], crash_text: key[2] }
          built = [Native::Protocol.new(options.name, native_options(options), words), words]
          @natives_lock.synchronize do
            natives = @natives.size >= NATIVES_LIMIT ? {}.compare_by_identity : @natives.dup
            natives[options] = (natives[options] || {}).merge(key => built)
            @natives = natives
          end
          built
        end

        private

        def native_options(options)
          { lease: options.lease.to_f, on_stale: options.on_stale, on_mismatch: options.on_mismatch,
            lookup: options.lookup ? options.lookup_label : nil, heartbeat: options.heartbeat ? true : false,
            max_run: options.max_run.to_f, lock_timeout: options.lock_timeout.to_f,
            defer_margin: IdempotentJob.configuration.defer_margin.to_f,
            store_result: options.store_result ? true : false, max_takeovers: options.max_takeovers }
        end
      end

      # A claim's heartbeat as {HeartbeatWatch} watches it: `report` while the body runs,
      # `stop` when it ended (the core's notes about it kept for the driver to tell).
      class Beat
        # @return [Array] the core's notes from stopping
        attr_reader :notes

        # @param native_claim [Native::Claim]
        # @param words [Hash] the door's words
        def initialize(native_claim, words)
          @native_claim = native_claim
          @words = words
          @notes = []
          @last = nil
        end

        # @return [Hash] see `Native::Heartbeat#report`
        def report
          @last = @native_claim.heartbeat_report || @last
        end

        # Stops renewing.
        # @return [Hash] the last report
        def stop
          last = report
          @notes = @native_claim.stop_heartbeat(@words)
          last
        end
      end

      # @param options [JobOptions]
      # @param door [Door]
      # @param narrator [Narrator]
      # @param session [Transactional::Direct, Transactional::Native] where the statements go
      def initialize(options, door, narrator, session)
        @options = options
        @door = door
        @narrator = narrator
        @native, @words = self.class.native(options, door)
        @session = session
        @transaction = session.is_a?(Transactional::Direct) ? nil : session
      end

      # Runs the delivery.
      # @param request [Hash] the claim request (see `Native::Store#claim`)
      # @param host [Object, nil] the object a lookup method is called on
      # @param wait [Float, nil] seconds to wait for a live claim to end (pool only)
      # @yieldparam claim [Claim]
      # @return [Outcome]
      # @raise see {Protocol#run}
      def run(request, host, wait = nil, &)
        deferrals = @narrator.delivery.deferrals
        step, value, notes = wait ? waited(request, deferrals, wait) : call(:begin, request, deferrals)
        return in_progress(value, notes) if step == :in_progress

        tell(notes)
        return finish(step, value, nil) unless %i[run ask_lookup].include?(step)

        claim = claim_of(value)
        IdempotentJob.with_claim(claim) do
          step, value = ask_lookup(value, claim, host) if step == :ask_lookup
          next finish(step, value, claim) unless step == :run

          result, result_state = execute(value, claim, &)
          Outcome.new(:ran, value: result, claim:, result_state:)
        end
      end

      private

      # Begins a delivery that waits up to `seconds` for a live claim (the pool only:
      # `perform_once` refuses `wait:` with a transaction): the core says it will wait
      # (told at once), then waits and decides again.
      def waited(request, deferrals, seconds)
        step, value, notes = @native.begin_waiting(IdempotentJob.store, request, deferrals, seconds)
        return [step, value, notes] unless step == :wait

        tell(notes)
        @native.wait(IdempotentJob.store, request, deferrals, seconds)
      end

      # Calls the native protocol's `name` on this delivery's channel: the pool, the
      # gem's transaction (`name_in`) or ActiveRecord's (`name_with`, whose statements
      # the session sends through ActiveRecord's connection).
      def call(name, *args)
        case @session
        when Transactional::Direct then @native.public_send(name, IdempotentJob.store, *args)
        when Transactional::Native then @native.public_send(:"#{name}_in", @session.native, *args)
        else @native.public_send(:"#{name}_with", @session, *args)
        end
      end

      def claim_of(native_claim)
        info = native_claim.info
        Claim.new(job_type: info[:job_type], operation_key: info[:operation_key], token: info[:token],
                  attempt: info[:attempt], kind: info[:kind], jid: info[:jid])
      end

      # A step that does not run the body: the outcome, or the error raised. A repeat
      # of a completed operation whose completion stored a result replays it: its value
      # (parsed from the stored JSON) and `replayed: true`.
      def finish(step, value, claim)
        raise value if step == :error

        result_state = value[:result_state]
        replayed = value[:decision] == :completed && !result_state.nil?
        stored = value[:result_json] && JSON.parse(value[:result_json], max_nesting: Native::MAX_NESTING)
        Outcome.new(value[:decision], duplicates: value[:duplicates], claim:, value: stored, result_state:, replayed:)
      end

      def in_progress(value, notes)
        outcome = Outcome.new(:in_progress, retry_after: value[:retry_after],
                                            lease_remaining: value[:lease_remaining], holder: value[:holder])
        deferred, before = notes.partition { |note| note[0] == :deferred }
        tell(before)
        # Before the deferral is told: a door that cannot bring the delivery back raises.
        @door.defer(@narrator.delivery, outcome)
        tell(deferred)
        outcome
      end

      def ask_lookup(native_claim, claim, host)
        answer, failure = lookup_answer(claim, host)
        step, value, notes = call(:after_lookup, native_claim, answer)
        tell(notes)
        # The lookup's own error is the LookupError's cause.
        raise value, cause: failure if step == :error && failure

        [step, value]
      end

      # What the lookup answered, as the core takes it, and the error it raised (if any).
      def lookup_answer(claim, host)
        lookup = @options.lookup
        answer = if lookup.respond_to?(:call)
                   lookup.call(claim.operation_key)
                 elsif host.nil?
                   raise ConfigurationError, "#{@options.name}: #{@options.lookup_label} needs the job object, " \
                                             "none was given"
                 else
                   host.public_send(lookup, claim.operation_key)
                 end
        symbol = answer.respond_to?(:to_sym) ? answer.to_sym : nil
        [JobOptions::LOOKUP_ANSWERS.include?(symbol) ? symbol : [:invalid, answer.inspect], nil]
      rescue StandardError => e
        [[:raised, "#{e.class}: #{e.message}"], e]
      end

      # Runs the body under the claim, then completes (or releases when it raised).
      def execute(native_claim, claim, &body)
        return execute_in_transaction(native_claim, claim, &body) if @transaction

        beat = native_claim.heartbeat? && HeartbeatWatch.watch(Beat.new(native_claim, @words), claim)
        begin
          result = begin
            body.call(claim)
          ensure
            # Before the release or completion, and also on Thread#kill and throw (which
            # skip rescue): a dead job's lease must run out.
            stop_heartbeat(native_claim, beat)
          end
        rescue Exception => e # rubocop:disable Lint/RescueException -- re-raised; the claim must not stay held
          give_back(native_claim, e)
          raise
        end
        completed(call(:complete, native_claim, prepared(claim, result)), result)
      end

      # The completion's answer told; `[the body's value, its stored result's state]`.
      def completed(answer, result)
        step, value, notes = answer
        tell(notes)
        raise value if step == :error

        [result, value[:result_state]]
      end

      # `[json, state, warning]` for the completion (see `Native::Store#prepare_result`:
      # the core checks size and JSON), or nil without `store_result`.
      def prepared(claim, value)
        return nil unless @options.store_result

        json, reason = ResultJson.encode(value)
        IdempotentJob.store.prepare_result(claim.job_type, claim.operation_key, json, reason)
      end

      def stop_heartbeat(native_claim, beat)
        if beat
          HeartbeatWatch.stop(beat)
          tell(beat.notes)
        else
          tell(native_claim.stop_heartbeat(@words))
        end
      end

      # The claim of a body that raised: kept after a crash (the door's rule, on the
      # error or any of its causes), released otherwise.
      def give_back(native_claim, error)
        notes = if crash?(error)
                  @native.keep(native_claim)
                else
                  @native.release(IdempotentJob.store, native_claim, error.class.name.to_s, error.message.to_s)
                end
        tell(notes)
      end

      def crash?(error)
        seen = []
        while error && !seen.include?(error)
          return true if @door.crash?(error)

          seen << error
          error = error.cause
        end
        false
      end

      # In the gem's transaction: the body writes through its handle, the completion is
      # written in the same transaction (once); a raising body rolls everything back.
      def execute_in_transaction(native_claim, claim, &body)
        IdempotentJob.with_transaction(@transaction.handle) do
          result = body.call(claim)
          completed(call(:complete, native_claim, prepared(claim, result)), result)
        end
      end

      # Tells the core's notes: events to their listeners, lines to the door's logger.
      def tell(notes)
        delivery = @narrator.delivery
        notes.each do |event, details, level, text, attempt|
          if event && Events.listened?(event)
            payload = { job_type: delivery.job_type, operation_key: delivery.operation_key, jid: delivery.id }
            payload[:attempt] = attempt if attempt
            Events.publish(event, payload.merge!(details))
          end
          @narrator.say(level, text) if level
        end
      end
    end
  end
end
