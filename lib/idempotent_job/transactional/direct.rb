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

      SESSION = new.freeze
      private_constant :SESSION
    end
  end
end
