# frozen_string_literal: true

# A job with a single-parameter operation key: the README's example.
class ChargeOrderJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, retry: 3

  def perform(order_id, amount_cents)
    SpecHooks.call(:inside, self)
    SpecHooks.call(:before_effect, order_id)
    Effects.record("charge", order_id)
    SpecHooks.call(:after_effect, order_id, amount_cents)
  end
end

# The same body without a key declaration: passes through the middleware untouched.
class UnkeyedJob
  include Sidekiq::Job

  def perform(order_id)
    Effects.record("unkeyed", order_id)
  end
end

# A composite key reaching into a Hash argument.
class ShipParcelJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: ["payload.order.id", :carrier], idempotency_scope: "shipping"

  def perform(payload, carrier)
    Effects.record("ship", "#{payload.dig("order", "id")}/#{carrier}")
  end
end

# Another class sharing ShipParcelJob's scope: the same operation, not run twice.
class ShipParcelV2Job
  include Sidekiq::Job
  sidekiq_options idempotency_key: ["payload.order.id", 1], idempotency_scope: "shipping"

  def perform(payload, carrier)
    Effects.record("ship", "#{payload.dig("order", "id")}/#{carrier}")
  end
end

# A job whose outside system can say whether an effect happened: the lookup asks it.
class CapturePaymentJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :payment_id, idempotency_lookup: :captured?

  def perform(payment_id)
    SpecHooks.call(:before_effect, payment_id)
    Effects.record("capture", payment_id)
    SpecHooks.call(:after_effect, payment_id)
  end

  def captured?(payment_id)
    SpecHooks.call(:lookup, payment_id)
  end
end

# A short job under a long lease: a duplicate that meets its live claim should come back
# soon after it finishes, not when the lease would end. The holder finishes as soon as a
# duplicate has met its claim (at most 20 s), so the two always overlap.
class QuickUnderLongLeaseJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_lease: 30

  def perform(order_id)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
    sleep 0.05 until IdempotentJob.record(self.class, order_id).duplicates.positive? ||
                     Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    Effects.record("quick", order_id)
  end
end
