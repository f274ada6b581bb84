# frozen_string_literal: true

# (j) stands in for an application's controller: placing an order charges it. Its
# enqueue is stamped with this line as the producer (the first caller frame outside the
# gem and Sidekiq).
class OrdersController
  def create(order_id)
    ChargeOrderJob.perform_async(order_id, 1800)
  end
end
