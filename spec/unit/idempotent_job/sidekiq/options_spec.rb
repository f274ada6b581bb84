# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::Sidekiq::Options do
  let(:job_class) do
    Class.new do
      include Sidekiq::Job
      sidekiq_options idempotency_key: 0, idempotency_lease: 60

      def self.name = "OptionsSpecJob"

      def perform(_id); end
    end
  end

  def resolve(job_hash = {})
    described_class.resolve(job_class, { "class" => "OptionsSpecJob", "args" => [1] }.merge(job_hash))
  end

  it "remembers a class's options: the next delivery with the same option values gets the same object" do
    first = resolve("idempotency_key" => 0)
    expect(resolve("idempotency_key" => 0)).to equal(first)
    expect(first.lease).to eq(60)
  end

  it "reads a per-push override after a delivery without it, and the class's value again after it" do
    expect(resolve.lease).to eq(60)
    expect(resolve("idempotency_lease" => 5).lease).to eq(5)
    expect(resolve.lease).to eq(60)
  end

  it "tells a job hash value of nil (the default) from an absent one (the class's value)" do
    default = IdempotentJob.configuration.lease
    expect(resolve.lease).to eq(60)
    expect(resolve("idempotency_lease" => nil).lease).to eq(default)
    expect(resolve.lease).to eq(60)
    expect(resolve("idempotency_lease" => nil).lease).to eq(default)
  end

  it "follows a change of the class's sidekiq_options and of the settings" do
    expect(resolve.lease).to eq(60)
    job_class.sidekiq_options idempotency_lease: 90
    expect(resolve.lease).to eq(90)
    IdempotentJob.configure(lease: 45)
    job_class.sidekiq_options idempotency_lease: nil
    expect(resolve.lease).to eq(45)
  end

  it "passes a job without idempotency_key through, before and after it is remembered" do
    plain = Class.new { include Sidekiq::Job }
    2.times { expect(described_class.resolve(plain, { "class" => "Plain", "args" => [] })).to be_nil }
  end
end
