# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/testing"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"
require "idempotent_job/testing/active_job_subject"

# The testing kit on ActiveJob classes: be_idempotent_for / replay_job deliver the
# job's serialized form through its callbacks and the ActiveJob door.
RSpec.describe "The testing kit on an ActiveJob class" do
  around { |example| with_adapter(ActiveJob::Base.queue_adapter) { example.run } }

  it "passes be_idempotent_for in every scenario, threads and forked workers included" do
    expect(AjChargeOrderJob).to be_idempotent_for(order_id: 21, _cents: 100).with_effect { Effects.count }
  end

  it "fails with the gem disabled, naming the duplicate" do
    IdempotentJob::Testing.without_gem do
      matcher = be_idempotent_for(21, 100).with_effect { Effects.count }.in_scenarios(:repeated)
      expect(matcher.matches?(AjChargeOrderJob)).to be(false)
      expect(matcher.failure_message).to match(/DISABLED/)
    end
  end

  it "reports a replay of one scenario, keyed by a GlobalID" do
    SpecOrder.setup!
    order = SpecOrder.create!(number: "K-1")
    result = replay_job(AjShipOrderJob, order, "dhl").repeated(times: 3)
    expect(result).to be_passed
    expect(result.effects).to eq(1)
    expect(result.record.operation_key).to eq(JSON.generate([order.to_global_id.to_s, "dhl"]))
  end

  describe "on Sidekiq's ActiveJob adapter inside Sidekiq::Testing.inline!" do
    before { ActiveJob::Base.queue_adapter = :sidekiq }

    it "runs perform_later once per operation and the matcher passes, leaving inline mode on" do
      Sidekiq::Testing.inline! do
        2.times { AjChargeOrderJob.perform_later(23, 100) }
        expect(Effects.count(23)).to eq(1)
        expect(IdempotentJob.record("AjChargeOrderJob", 23)).to have_attributes(status: :completed, duplicates: 1)
        expect(IdempotentJob.record("ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper", 23)).to be_nil
        matcher = be_idempotent_for(24, 100).with_effect { Effects.count }
        expect(AjChargeOrderJob).to matcher.in_scenarios(:repeated, :concurrent_threads, :killed_after_claim)
        expect(Sidekiq::Testing).to be_inline
      end
    end
  end
end
