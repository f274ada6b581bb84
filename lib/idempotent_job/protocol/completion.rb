# frozen_string_literal: true

require_relative "../native"

module IdempotentJob
  class Protocol
    # The completion of a body that ran is recorded by the core protocol
    # (`Protocol::complete` in crates/core/src/protocol.rs): outside a transaction it is
    # retried for a while after {RETRY_DELAYS} (the body has run, so whatever goes
    # wrong now must not fail the delivery, whose retry would repeat its effect); in a
    # transaction it is written once, with the body's statements.
    class Completion
      # Seconds to wait before each new attempt after a failed one (15.3 s in all): the
      # core's (`COMPLETION_RETRY_DELAYS`), which retries the completion of every
      # delivery but ActiveRecord-transactional ones.
      RETRY_DELAYS = Native.completion_retry_delays.freeze
    end
  end
end
