# frozen_string_literal: true

module IdempotentJob
  class Protocol
    # A delivery whose payload differs from its claim's (same operation key): logged
    # and published, and under `on_mismatch: :raise` refused unless this delivery won
    # the claim.
    class Mismatch
      # @param options [JobOptions] its `on_mismatch`
      # @param narrator [Narrator]
      # @param decision [Hash] the claim's decision
      # @return [void]
      # @raise [PayloadMismatchError] when refused
      def self.check!(options, narrator, decision)
        text = "#{narrator.describe} was delivered with arguments that differ from those of its claim " \
               "(same operation key, different payload)"
        refused = options.on_mismatch == :raise && decision[:decision] != :claimed
        narrator.emit_delivery(:mismatch, refused:)
        unless refused
          narrator.warn(text)
          return
        end
        narrator.error("#{text}; delivery refused")
        raise PayloadMismatchError, "#{text}; refused (idempotency_on_mismatch: :raise), the job was not run"
      end
    end
  end
end
