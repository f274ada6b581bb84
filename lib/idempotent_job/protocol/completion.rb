# frozen_string_literal: true

require_relative "../native"

module IdempotentJob
  class Protocol
    # Records that a claimed body ran, inside an ActiveRecord transaction (once; the
    # transaction fails as a whole). Outside a transaction the core protocol records
    # the completion and retries it for a while after {RETRY_DELAYS} (the body has
    # run, so whatever goes wrong now must not fail the delivery, whose retry would
    # repeat its effect; see `Protocol::complete` in crates/core/src/protocol.rs).
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
    end
  end
end
