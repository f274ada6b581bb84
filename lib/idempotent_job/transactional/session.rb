# frozen_string_literal: true

module IdempotentJob
  module Transactional
    # What the transactional strategies share: the claim, the body's statements
    # (through {#handle}, set as {IdempotentJob.current_transaction}) and the completion
    # commit together; a raising body rolls everything back (nothing to release). The
    # core protocol ({Protocol::Driver}) drives the steps.
    class Session
      # @return [IdempotentJob::Transaction, nil] the handle the body writes through
      #   (nil: the body uses its own driver, e.g. ActiveRecord's models)
      def handle = nil
    end
  end
end
