# frozen_string_literal: true

# (j) stands in for a payment provider's webhook handler that also charges the order
# when its notice arrives, a few seconds after the controller did: another producer of
# the same operation.
class StripeWebhook
  NOTICE_DELAY = 3

  def handle(order_id)
    ChargeOrderJob.perform_in(NOTICE_DELAY, order_id, 1800)
  end
end
