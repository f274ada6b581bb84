# frozen_string_literal: true

module IdempotentJob
  # Helpers for job classes, included automatically into every job class that the
  # middleware runs with a claim. Inside `perform`:
  #
  #   def perform(order_id, amount_cents)
  #     Gateway.charge(amount_cents, reference: idempotency_key, attempt: idempotency_attempt)
  #   end
  module Job
    # @return [IdempotentJob::Claim, nil] the claim of the running delivery, nil outside one
    def idempotency_claim
      IdempotentJob.current_claim
    end

    # @return [String, nil] the operation key of the running delivery
    def idempotency_key
      idempotency_claim&.operation_key
    end

    # @return [Integer, nil] the claim's attempt: 1 for the first, more after a retry or takeover
    def idempotency_attempt
      idempotency_claim&.attempt
    end

    # @return [IdempotentJob::Transaction, nil] the handle of a job declared with
    #   `idempotency_transaction: true`: its statements commit with the claim and the
    #   completion (nil for other jobs)
    def idempotent_transaction
      IdempotentJob.current_transaction
    end
  end
end
