# frozen_string_literal: true

require_relative "../native"

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
      # Seconds to wait before each new attempt after a failed one (15.3 s in all): the
      # core's (`COMPLETION_RETRY_DELAYS`), which retries the completion of every
      # delivery but ActiveRecord-transactional ones.
      RETRY_DELAYS = Native.completion_retry_delays.freeze

      # @param session [#fenced] where the fenced change goes (a strategy's session)
      # @param narrator [Narrator]
      def initialize(session, narrator)
        @session = session
        @narrator = narrator
      end

      # Records the completion once, raising whatever fails (inside a transaction).
      # @param claim [Claim]
      # @param duration [Float] seconds the body ran
      # @return [void]
      # @raise [LostClaimError, Error]
      def record!(claim, duration)
        @session.fenced(:complete, claim)
        @narrator.emit(:completed, claim, duration:)
      end

      # Records the completion, retrying after {RETRY_DELAYS}; logs when it gives up.
      # @param claim [Claim]
      # @param duration [Float] seconds the body ran
      # @return [void]
      # @raise [LostClaimError] when the claim was taken over
      def record(claim, duration)
        failures = 0
        begin
          record!(claim, duration)
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
        end
      end
    end
  end
end
