# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # What the steps after a takeover (Lookup, StalePolicy, Takeover) share: the job's
    # options, the session their fenced changes go through, and the narrator. Internal.
    class Step
      # @param options [JobOptions]
      # @param session [#fenced] a strategy's session (see {Transactional})
      # @param narrator [Narrator]
      def initialize(options, session, narrator)
        @options = options
        @session = session
        @narrator = narrator
      end
    end
  end
end
