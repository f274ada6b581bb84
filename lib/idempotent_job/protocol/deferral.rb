# frozen_string_literal: true

require_relative "../native"

module IdempotentJob
  class Protocol
    # When a delivery that met a live claim comes back: soon at first (the holder
    # usually finishes quickly), doubling with each deferral the delivery has already
    # had, and never later than the holder's lease end plus the configured margin
    # ({Configuration#defer_margin}), so it is there when a dead holder's lease runs
    # out. Coming back early is safe: the claim statement decides again and a live
    # lease defers it again; the delivery itself is never dropped.
    class Deferral
      # @param lease_remaining [Numeric] seconds until the holder's lease ends
      # @param deferrals [Integer] deferrals this delivery had before this one
      # @param margin [Numeric] seconds added past the lease end
      # @return [Float] seconds until the delivery comes back
      def self.delay(lease_remaining, deferrals, margin: IdempotentJob.configuration.defer_margin)
        Native.deferral_delay(lease_remaining.to_f, deferrals.to_i.clamp(0, 2**31), margin.to_f)
      end
    end
  end
end
