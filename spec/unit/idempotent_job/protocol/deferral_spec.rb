# frozen_string_literal: true

require "spec_helper"
require "securerandom"

# A delivery that meets a live claim comes back after the core's back-off
# (`Native.deferral_delay`; the conformance vectors' delays hold its steps): never later
# than the holder's lease end plus the configured defer_margin.
RSpec.describe "a deferral's delay" do
  it "is the core's: 1 s, doubling per deferral, at most the lease end plus the margin" do
    expect((0..4).map { |n| IdempotentJob::Native.deferral_delay(300.0, n, 1.0) }).to eq([1.0, 2.0, 4.0, 8.0, 16.0])
    expect(IdempotentJob::Native.deferral_delay(3.2, 5, 1.0)).to be_within(0.001).of(4.2)
    expect(IdempotentJob::Native.deferral_delay(300.0, 10_000, 1.0)).to eq(301.0)
  end

  it "uses the configured defer_margin" do
    IdempotentJob.configure(defer_margin: 7)
    key = "margin-#{SecureRandom.hex(4)}"
    RecordRows.claim({ job_type: "DeferMarginJob", operation_key: key, jid: "holder", lease: 20.0 })
    outcome = IdempotentJob.perform_once("DeferMarginJob", key, deferrals: 40) { raise "the holder's claim is live" }
    expect(outcome.decision).to eq(:in_progress)
    expect(outcome.retry_after).to be_within(0.5).of(outcome.lease_remaining + 7)
  end
end
