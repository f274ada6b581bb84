# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Records that a claimed body ran. Outside a transaction it retries for a while:
    # the body has run, so whatever goes wrong now (connection lost, a PostgreSQL
    # restart or failover, a lock or statement timeout) must not fail the delivery,
    # whose retry would repeat its effect. The retries span about 15 s, longer than a
    # PostgreSQL restart takes; repeating the fenced completion is harmless (it is
    # idempotent for its own token, and fails as a lost claim once another delivery
    # took the operation over). If the completion still cannot be written the record
    # stays claimed and its lease decides what a later delivery does. Only a lost
    # claim is raised: another delivery owns the operation now.
    class Completion
      # Seconds to wait before each new attempt after a failed one (15.3 s in all).
      RETRY_DELAYS = [0.05, 0.25, 1.0, 2.0, 4.0, 8.0].freeze

      # @param session [#fenced] where the fenced change goes (a strategy's session)
      # @param narrator [Narrator]
      # @param options [JobOptions, nil] the job's options (`store_result`); nil: store nothing
      def initialize(session, narrator, options = nil)
        @session = session
        @narrator = narrator
        @store_result = options&.store_result
      end

      # Records the completion once, raising whatever fails (inside a transaction).
      # With `store_result`, the body's value goes with it, in the same statement.
      # @param claim [Claim]
      # @param duration [Float] seconds the body ran
      # @param value [Object] the body's return value
      # @return [Symbol, nil] the result's state (:stored, :too_large, :unencodable), nil
      #   without `store_result`
      # @raise [LostClaimError, Error]
      def record!(claim, duration, value = nil)
        result = prepared(claim, value)
        @session.fenced(:complete, claim, nil, result)
        @narrator.emit(:completed, claim, duration:, result_state: result&.[](1))
        not_stored(claim, result) if result && result[2]
        result&.[](1)
      end

      # Records the completion, retrying after {RETRY_DELAYS}; logs when it gives up.
      # @param claim [Claim]
      # @param duration [Float] seconds the body ran
      # @param value [Object] the body's return value
      # @return [Symbol, nil] as {#record!}
      # @raise [LostClaimError] when the claim was taken over
      def record(claim, duration, value = nil)
        failures = 0
        begin
          record!(claim, duration, value)
        rescue LostClaimError => e
          @narrator.emit(:lost_claim, claim, during: :completion)
          @narrator.error("#{@narrator.describe_claim(claim)} ran, but lost its claim: #{e.message}")
          raise
        rescue Error => e
          delay = RETRY_DELAYS[failures]
          failures += 1
          if delay
            sleep(delay)
            retry
          end
          @narrator.error("#{@narrator.describe_claim(claim)} ran, but its completion could not be recorded " \
                          "after #{failures} attempts (#{e.class}: #{e.message}); the record stays claimed " \
                          "until its lease ends, after which a redelivery would run it again")
          nil
        end
      end

      private

      # `[json, state, warning]` for the completion (see `Native::Store#prepare_result`:
      # the core checks size and JSON), or nil without `store_result`.
      def prepared(claim, value)
        return nil unless @store_result

        json, reason = ResultJson.encode(value)
        IdempotentJob.store.prepare_result(claim.job_type, claim.operation_key, json, reason)
      end

      # A result the completion could not store: warned and published, never raised.
      def not_stored(claim, result)
        @narrator.warn(result[2])
        @narrator.emit(:result_not_stored, claim, result_state: result[1], reason: result[2])
      end
    end
  end
end
