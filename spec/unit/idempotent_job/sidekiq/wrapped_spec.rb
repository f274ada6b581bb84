# frozen_string_literal: true

require "spec_helper"

# A stand-in for an ActiveJob class that declared its key the Sidekiq way (no ActiveJob
# needed: the door only reads the payload and get_sidekiq_options).
class WrappedKeyedJob
  def self.get_sidekiq_options # rubocop:disable Naming/AccessorMethodName -- Sidekiq's name
    { "idempotency_key" => :order_id }
  end
end

RSpec.describe IdempotentJob::Sidekiq::Wrapped do
  let(:middleware) { IdempotentJob::Sidekiq::ServerMiddleware.new }
  let(:wrapper) { Struct.new(:jid).new("w1") }

  it "passes a payload of Sidekiq's ActiveJob adapter through untouched: no record under the wrapper" do
    job = { "class" => "Sidekiq::ActiveJob::Wrapper", "wrapped" => "SomeActiveJob", "jid" => "w1",
            "args" => [{ "job_id" => "x", "arguments" => [42] }], "queue" => "default" }
    expect(middleware.call(wrapper, job, "default") { :ran }).to eq(:ran)
    expect(IdempotentJob.record("Sidekiq::ActiveJob::Wrapper", "42")).to be_nil
  end

  it "refuses an idempotency_key declared the Sidekiq way on the wrapped class, or in the payload" do
    job = { "class" => "Sidekiq::ActiveJob::Wrapper", "wrapped" => "WrappedKeyedJob", "jid" => "w1",
            "args" => [{}], "queue" => "default" }
    expect { middleware.call(wrapper, job, "default") { raise "must not run" } }
      .to raise_error(IdempotentJob::ConfigurationError, /\AWrappedKeyedJob: an ActiveJob class run through/)
    keyed = job.merge("wrapped" => "SomeActiveJob", "idempotency_key" => 0)
    expect { middleware.call(wrapper, keyed, "default") { raise "must not run" } }
      .to raise_error(IdempotentJob::ConfigurationError, /include IdempotentJob::ActiveJob/)
  end
end
