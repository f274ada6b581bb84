# frozen_string_literal: true

module IdempotentJob
  module Transactional
    # The default strategy: each statement on a pooled connection of its own. The core
    # protocol ({Protocol::Driver}, `Native::Protocol#perform` over the store's pool)
    # renews the lease while the body runs, releases the claim when it raises and
    # retries the completion briefly when it cannot be written; this session only says
    # "the pool" to the driver.
    class Direct
      # Yields the (stateless) session.
      # @yieldparam session [Direct]
      # @return [Object] the block's value
      def self.within
        yield SESSION
      end

      SESSION = new.freeze
      private_constant :SESSION
    end
  end
end
