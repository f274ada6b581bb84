# frozen_string_literal: true

module IdempotentJob
  module Transactional
    # The default strategy: each statement on a pooled connection of its own; the
    # lease is renewed while the body runs, the claim released when it raises and the
    # completion retried briefly when it cannot be written.
    class Direct
      # Yields the (stateless) session.
      # @yieldparam session [Direct]
      # @return [Object] the block's value
      def self.within
        yield SESSION
      end

      # @return [nil] no transaction handle
      def handle = nil

      # @param request [Hash] see `Native::Store#claim`
      # @param _lock_timeout [Numeric] unused outside a transaction
      # @return [Hash] the decision
      # @raise [ConnectionError, TimeoutError, DatabaseError]
      def claim(request, _lock_timeout)
        IdempotentJob.store.claim(request)
      end

      # @param change [Symbol] :complete, :release, :hold, :give_up or :expire
      # @param claim [Claim]
      # @param text [String, nil] the error text of :release / :expire
      # @param result [Array, nil] :complete's stored result (`Native::Store#prepare_result`)
      # @return [true]
      # @raise [LostClaimError] when the claim is no longer held
      def fenced(change, claim, text = nil, result = nil)
        IdempotentJob.store.fenced_with_result(change, claim.job_type, claim.operation_key, claim.token, text, result)
      end

      # Runs the body with a heartbeat; releases the claim when it raises (and
      # re-raises), records the completion when it returns.
      # @param claim [Claim]
      # @param options [JobOptions]
      # @param narrator [Protocol::Narrator]
      # @return [Array(Object, Symbol)] the body's value, and its stored result's state
      #   (nil without `store_result`)
      # @raise [Exception] what the body raised; [LostClaimError] from the completion
      def run(claim, options, narrator)
        heartbeat = Protocol::Heartbeat.start(options, claim, narrator)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        begin
          result = begin
            yield
          ensure
            # Before the release or completion, and also on Thread#kill and throw (which
            # skip rescue): a dead job's lease must run out.
            heartbeat.stop
          end
        rescue Exception => e # rubocop:disable Lint/RescueException -- re-raised; the claim must not stay held
          Protocol::Release.new(self, narrator).call(claim, e)
          raise
        end
        state = Protocol::Completion.new(self, narrator, options)
                                    .record(claim, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, result)
        [result, state]
      end

      SESSION = new.freeze
      private_constant :SESSION
    end
  end
end
