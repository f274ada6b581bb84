# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Asks the job whether a stale claim's effect happened: the host's lookup method
    # (or a callable) gets the operation key and answers :done, :not_done or :unknown.
    # A lookup that raises or answers something else ends the stale claim's lease
    # (so the next delivery asks again) and raises {LookupError}; the body is not run.
    class Lookup < Step
      # @param claim [Claim] the claim taken over
      # @param host [Object, nil] the object whose lookup method is called
      # @return [Symbol] :done, :not_done or :unknown
      # @raise [LookupError] as described above
      def ask(claim, host)
        answer = call(claim, host)
        symbol = answer.respond_to?(:to_sym) ? answer.to_sym : nil
        unless JobOptions::LOOKUP_ANSWERS.include?(symbol)
          raise LookupError, "#{label} of #{describe(claim)} answered #{answer.inspect}; " \
                             "expected :done, :not_done or :unknown"
        end
        @narrator.info("#{label} of #{describe(claim)} answered :#{symbol}")
        @narrator.emit(:lookup, claim, answer: symbol)
        symbol
      rescue StandardError => e
        expire(claim, e)
        raise if e.is_a?(LookupError)

        raise LookupError, "#{label} of #{describe(claim)} raised #{e.class}: #{e.message}; the job was not " \
                           "run, the next delivery asks again"
      end

      private

      def label
        @options.lookup_label
      end

      def describe(claim)
        @narrator.describe_claim(claim)
      end

      def call(claim, host)
        lookup = @options.lookup
        return lookup.call(claim.operation_key) if lookup.respond_to?(:call)
        raise ConfigurationError, "#{@options.name}: #{label} needs the job object, none was given" if host.nil?

        host.public_send(lookup, claim.operation_key)
      end

      def expire(claim, error)
        @narrator.error("lookup of #{describe(claim)} failed (#{error.class}: #{error.message}); " \
                        "not run, the claim stays stale for the next delivery")
        @session.fenced(:expire, claim, "lookup failed: #{error.class}: #{error.message}"[0, Native.error_text_limit])
      rescue Error => e
        @narrator.error("could not end the lease of #{describe(claim)} (#{e.message}); it ends by itself")
      end
    end
  end
end
