# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Gives a claim back after its body raised, so the queue's retry claims it again
    # at once, unless the door calls the error a crash (a hard shutdown): then the
    # claim is kept and its lease decides. Never raises: a release that cannot be
    # written leaves the claim for its lease to end. Internal.
    class Release
      # Longest error text stored in `last_error`.
      ERROR_TEXT_LIMIT = 1000

      # @param session [#fenced]
      # @param narrator [Narrator]
      def initialize(session, narrator)
        @session = session
        @narrator = narrator
      end

      # @param claim [Claim]
      # @param error [Exception] what the body raised
      # @return [void]
      def call(claim, error)
        if crash?(error)
          @narrator.warn("#{@narrator.door.crash_text}: the claim of #{@narrator.describe_claim(claim)} " \
                         "is kept until its lease ends")
          return
        end
        @session.fenced(:release, claim, "#{error.class}: #{error.message}"[0, ERROR_TEXT_LIMIT])
        @narrator.emit(:released, claim, error: error.class.name)
      rescue Error => e
        @narrator.error("could not release the claim of #{@narrator.describe_claim(claim)} " \
                        "(#{e.class}: #{e.message}); it stays claimed until its lease ends")
      end

      private

      # The error, or any of its causes, is a crash by the door's rule.
      def crash?(error)
        seen = []
        while error && !seen.include?(error)
          return true if @narrator.door.crash?(error)

          seen << error
          error = error.cause
        end
        false
      end
    end
  end
end
