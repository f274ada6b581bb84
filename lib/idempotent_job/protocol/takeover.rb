# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Decides what a delivery that took over a stale claim does: asks the lookup
    # ({Lookup}), then, when it does not know, applies the stale policy ({StalePolicy}).
    class Takeover < Step
      # @param claim [Claim] the claim taken over
      # @param host [Object, nil] the object asked by a lookup method
      # @return [Symbol] :ran (run the body), :completed, :held or :given_up
      # @raise [LookupError] when the lookup fails
      def decide(claim, host)
        answer = @options.lookup ? Lookup.new(@options, @session, @narrator).ask(claim, host) : :unknown
        described = @narrator.describe_claim(claim)
        case answer
        when :done
          @session.fenced(:complete, claim)
          @narrator.warn("took over the stale claim of #{described}; #{@options.lookup_label} says it is done: " \
                         "marked completed, not run")
          :completed
        when :not_done
          @narrator.warn("took over the stale claim of #{described}; #{@options.lookup_label} says it is not " \
                         "done: running it")
          :ran
        else StalePolicy.new(@options, @session, @narrator).apply(claim)
        end
      end
    end
  end
end
