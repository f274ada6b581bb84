# frozen_string_literal: true

module IdempotentJob
  module Transactional
    # The native flavour (`transaction: true`): a transaction on a pooled connection
    # of the gem; the body writes through {IdempotentJob::Transaction}.
    # Protocol deliveries under `transaction: true` open it in their one native call
    # (`Native::Protocol#perform`); {.within} serves callers outside a delivery
    # (IdempotentJob::Testing).
    class Native
      # @return [IdempotentJob::Transaction] the handle the job body writes through
      attr_reader :handle

      # Opens a transaction, yields the session, commits when the block returns and
      # rolls back when it raises.
      # @yieldparam session [Native]
      # @return [Object] the block's value
      # @raise [ConnectionError, TimeoutError, DatabaseError]
      def self.within
        native = IdempotentJob.store.transaction
        result = yield new(native)
        native.commit
        result
      ensure
        # Not committed (an exception, Thread#kill, throw): roll back now rather than
        # leave the transaction open, holding the operation's row, until GC.
        if native&.open?
          begin
            native.rollback
          rescue IdempotentJob::Error
            nil # the connection is closed instead; PostgreSQL rolls back
          end
        end
      end

      # @param native [IdempotentJob::Native::Transaction]
      def initialize(native)
        @handle = IdempotentJob::Transaction.new(native)
      end
    end
  end
end
