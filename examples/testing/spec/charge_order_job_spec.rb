# frozen_string_literal: true

RSpec.describe ChargeOrderJob do
  it "charges an order once, whatever the queue delivers" do
    expect(ChargeOrderJob).to be_idempotent_for(order_id: 42).with_effect { Charge.count }
  end

  it "charges two orders once each" do
    expect(ChargeOrderJob).to be_idempotent_for(order_id: 42)
      .with_effect { Charge.count }
      .and_distinct_from(order_id: 43)
  end

  it "holds the claim while a worker dies after the charge; :reclaim then repeats it once" do
    result = replay_job(ChargeOrderJob, order_id: 42, effect: -> { Charge.count }).killed(after: :effect)
    expect(result).to be_passed, result.to_s
    expect(result.effects).to eq(2)
    expect(result.allowance).to include(":reclaim")
  end
end

RSpec.describe RefundJob do
  it "refunds once, even when a worker dies before its transaction commits" do
    expect(RefundJob).to be_idempotent_for(refund_id: "r-7", amount_cents: 500).with_effect { Refund.count }
  end
end
