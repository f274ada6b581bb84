# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/producer"
require_relative "../../support/producer_stamper"
require_relative "../../support/active_job_jobs"
require_relative "../../support/active_job_workers"

RSpec.describe IdempotentJob::Producer do
  after { described_class.resolver = nil }

  def enqueue_here = described_class.current

  # Where the client middleware chain lives: Sidekiq 7+'s default configuration, Sidekiq 6's module.
  def client_config = Sidekiq.respond_to?(:default_configuration) ? Sidekiq.default_configuration : Sidekiq

  it "is the first caller frame outside the gem and the queue library, relative to the app's root" do
    expect(described_class.current).to eq("spec/unit/idempotent_job/producer_spec.rb:#{__LINE__}")
    described_class.ignored << "spec/support/producer_stamper.rb"
    client_config.client_middleware { |chain| chain.add ProducerStamper }
    UnkeyedJob.perform_async(1)
    line = __LINE__ - 1
    expect(UnkeyedJob.jobs.last["idempotency_producer"]).to eq("spec/unit/idempotent_job/producer_spec.rb:#{line}")
  ensure
    client_config.client_middleware { |chain| chain.remove ProducerStamper }
    described_class.ignored.clear
  end

  it "is the name the app gives, around an enqueue or for every enqueue, cut to 200 characters" do
    expect(described_class.with("StripeWebhook#handle") { enqueue_here }).to eq("StripeWebhook#handle")
    described_class.resolver = -> { "x" * 300 }
    expect(enqueue_here).to eq("x" * 200)
    expect(described_class.with("inner") { enqueue_here }).to eq("inner")
    described_class.resolver = -> {}
    expect(enqueue_here).to start_with("spec/unit/idempotent_job/producer_spec.rb:")
  end

  it "keeps the producer a payload already has (a retry keeps its first enqueue's)" do
    expect(described_class.stamp({ "idempotency_producer" => "first" })).to eq("idempotency_producer" => "first")
    expect(described_class.with("second") { described_class.stamp({})["idempotency_producer"] }).to eq("second")
  end

  it "is stamped by the Sidekiq door's client middleware on a keyed job, and kept by a re-push" do
    line = __LINE__ + 1
    ChargeOrderJob.perform_async(7, 100)
    job = ChargeOrderJob.jobs.last
    expect(job["idempotency_producer"]).to eq("spec/unit/idempotent_job/producer_spec.rb:#{line}")
    UnkeyedJob.perform_async(1)
    expect(UnkeyedJob.jobs.last).not_to have_key("idempotency_producer")
    Sidekiq::Client.push(job.merge("class" => "ChargeOrderJob")) # a poller's push, by name
    expect(ChargeOrderJob.jobs.last["idempotency_producer"]).to eq(job["idempotency_producer"])
  end

  it "is stamped by the ActiveJob door at enqueue and carried in the serialized job" do
    with_adapter(:test) do
      line = __LINE__ + 1
      AjChargeOrderJob.perform_later(8, 100)
      data = ActiveJob::Base.queue_adapter.enqueued_jobs.last
      expect(data["idempotency_producer"]).to eq("spec/unit/idempotent_job/producer_spec.rb:#{line}")
      expect(ActiveJob::Base.deserialize(data).idempotency_producer).to eq(data["idempotency_producer"])
    end
  end
end
