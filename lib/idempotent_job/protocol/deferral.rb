# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # When a delivery that met a live claim comes back: soon at first (the holder
    # usually finishes quickly), doubling with each deferral the delivery has already
    # had, and never later than the holder's lease end plus the configured margin
    # ({Configuration#defer_margin}), so it is there when a dead holder's lease runs
    # out. Coming back early is safe: the claim statement decides again and a live
    # lease defers it again; the delivery itself is never dropped.
    class Deferral
      # Seconds before the first return.
      FIRST_DELAY = 1.0
      # Growth per deferral.
      FACTOR = 2

      # @param lease_remaining [Numeric] seconds until the holder's lease ends
      # @param deferrals [Integer] deferrals this delivery had before this one
      # @param margin [Numeric] seconds added past the lease end
      # @return [Float] seconds until the delivery comes back
      def self.delay(lease_remaining, deferrals, margin: IdempotentJob.configuration.defer_margin)
        latest = lease_remaining.to_f + margin
        backoff = FIRST_DELAY * (FACTOR**[deferrals.to_i, 30].min)
        [backoff, latest].min
      end
    end
  end
end
