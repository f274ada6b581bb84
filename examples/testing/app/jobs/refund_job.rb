# frozen_string_literal: true

# Records a refund in the same transaction as its claim and completion: a worker that
# dies before the commit leaves neither the refund nor the claim behind.
class RefundJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :refund_id, idempotency_transaction: :active_record

  def perform(refund_id, amount_cents)
    Refund.create!(refund_id:, amount_cents:)
  end
end
