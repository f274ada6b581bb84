# frozen_string_literal: true

module IdempotentJob
  module Transactional
    # The default strategy: each statement on a pooled connection of its own. The core
    # protocol ({Protocol::Driver}, `Native::Protocol`) renews the lease while the body
    # runs, releases the claim when it raises and retries the completion briefly when
    # it cannot be written; this session only claims and applies fenced changes for
    # callers that drive the steps themselves.
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

      SESSION = new.freeze
      private_constant :SESSION
    end
  end
end
