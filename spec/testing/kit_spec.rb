# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/testing"

# Kit-only jobs (the suite's jobs carry spec hooks the kit does not need).
class KitChargeJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id

  def perform(order_id, amount_cents)
    Effects.record("kit-charge", "#{order_id}/#{amount_cents}")
  end
end

RSpec.describe "The replay testing kit" do
  it "passes a protected job" do
    expect(KitChargeJob).to be_idempotent_for(order_id: 42, amount_cents: 1500).with_effect { Effects.count }
  end

  it "fails the same job with the gem disabled" do
    IdempotentJob::Testing.without_gem do
      matcher = be_idempotent_for(order_id: 42, amount_cents: 1500).with_effect { Effects.count }
      expect(matcher.matches?(KitChargeJob)).to be(false)
      puts matcher.failure_message
    end
  end
end
