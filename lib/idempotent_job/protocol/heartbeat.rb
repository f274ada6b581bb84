# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # Renews a claim's lease in the background while the body runs (the native
    # heartbeat), and reports when it stopped what it found. Internal.
    class Heartbeat
      # Starts renewing, unless the options turn the heartbeat off.
      # @param options [JobOptions] lease, heartbeat, max_run
      # @param claim [Claim]
      # @param narrator [Narrator]
      # @return [Heartbeat]
      # @raise [ConnectionError, DatabaseError] from the native store
      def self.start(options, claim, narrator)
        native = if options.heartbeat
                   IdempotentJob.store.heartbeat(claim.job_type, claim.operation_key,
                                                 claim.token, options.lease.to_f,
                                                 options.max_run.to_f)
                 end
        new(native, claim, narrator)
      end

      def initialize(native, claim, narrator)
        @native = native
        @claim = claim
        @narrator = narrator
      end

      # Stops renewing; logs a claim lost while running, or renewing stopped at max_run.
      # @return [void]
      def stop
        return unless @native

        report = @native.stop
        if report[:lost]
          @narrator.emit(:lost_claim, @claim, during: :heartbeat)
          @narrator.error("lost the claim of #{@narrator.describe_claim(@claim)} while it ran: a renewal " \
                          "found it taken over")
        elsif report[:max_run_reached]
          @narrator.warn("#{@narrator.describe_claim(@claim)} ran longer than its max_run; its lease " \
                         "was no longer renewed")
        end
      end
    end
  end
end
