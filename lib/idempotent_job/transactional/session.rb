# frozen_string_literal: true

module IdempotentJob
  module Transactional
    # What the transactional strategies share: the body runs with the transaction
    # handle as {IdempotentJob.current_transaction}, then the completion is written in
    # the same transaction. A raising body rolls everything back (nothing to release).
    class Session
      # @param claim [Claim]
      # @param _options [JobOptions]
      # @param narrator [Protocol::Narrator]
      # @return [Object] the body's value
      # @raise [Exception] what the body raised; [LostClaimError, Error] from the completion
      def run(claim, _options, narrator)
        IdempotentJob.with_transaction(handle) do
          started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          result = yield
          Protocol::Completion.new(self, narrator).record!(claim, Process.clock_gettime(Process::CLOCK_MONOTONIC) -
                                                                  started)
          result
        end
      end
    end
  end
end
