# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::Sidekiq::Compat do
  it "reads Sidekiq 8's integer-millisecond timestamps and older Float seconds as seconds" do
    expect(described_class.seconds(1_764_590_400_123)).to be_within(0.0001).of(1_764_590_400.123)
    expect(described_class.seconds(1_764_590_400.5)).to eq(1_764_590_400.5)
    expect(described_class.seconds(nil)).to be_nil
  end

  it "recognises the ActiveJob wrapper of every version, by the wrapped key or the class name" do
    expect(described_class.active_job?({ "class" => "X", "wrapped" => "ChargeJob" })).to be(true)
    expect(described_class.active_job?({ "class" => "Sidekiq::ActiveJob::Wrapper" })).to be(true)
    expect(described_class.active_job?({ "class" => "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper" }))
      .to be(true)
    expect(described_class.active_job?({ "class" => "ChargeOrderJob" })).to be(false)
  end

  it "knows the job module and the testing API of the running version" do
    expect(described_class.job_module).to eq(Sidekiq::Job)
    expect(IdempotentJob::Testing::SidekiqCompat.fake?).to be(true)
    expect(IdempotentJob::Testing::SidekiqCompat.fake_jobs_by_class).to be_a(Hash)
  end
end
