# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Applies the job's stale policy to a claim it took over whose holder's lease ran
    # out and whose lookup (if any) did not know: :reclaim runs the body again, :hold
    # holds the operation for a person, :skip gives it up.
    class StalePolicy < Step
      # @param claim [Claim] the claim taken over
      # @return [Symbol] :ran (run the body), :held or :given_up
      # @raise [LostClaimError, Error] when the hold or give-up cannot be written
      def apply(claim)
        described = @narrator.describe_claim(claim)
        case @options.on_stale
        when :hold
          @session.fenced(:hold, claim)
          @narrator.emit(:held, claim)
          @narrator.warn("#{described} is stale (#{why}): held for a person " \
                         "(IdempotentJob.resolve / rake idempotent_job:resolve)")
          :held
        when :skip
          @session.fenced(:give_up, claim)
          @narrator.emit(:given_up, claim)
          @narrator.warn("#{described} is stale (#{why}): given up, not run")
          :given_up
        else
          @narrator.warn("took over the stale claim of #{described} (#{why}): running it again (if the holder " \
                         "had done the effect, this is a duplicate)")
          :ran
        end
      end

      private

      def why
        @options.lookup ? "#{@options.lookup_label} does not know" : "its holder's lease ran out"
      end
    end
  end
end
