# frozen_string_literal: true

# Charges an order. The operation key is the order id: every delivery of the same
# order is the same operation, whatever its jid.
class ChargeOrderJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id

  def perform(order_id)
    Charge.create!(order_id:, amount_cents: 1500)
  end
end
