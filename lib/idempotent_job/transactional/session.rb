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
      # @return [Array(Object, Symbol)] the body's value, and its stored result's state
      #   (nil without `store_result`)
      # @raise [Exception] what the body raised; [LostClaimError, Error] from the completion
      def run(claim, options, narrator)
        IdempotentJob.with_transaction(handle) do
          started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          result = yield
          state = Protocol::Completion.new(self, narrator, options)
                                      .record!(claim, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, result)
          [result, state]
        end
      end
    end
  end
end
