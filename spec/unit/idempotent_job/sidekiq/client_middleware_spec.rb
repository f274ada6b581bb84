# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::Sidekiq::ClientMiddleware do
  it "refuses at enqueue a key whose job type and key exceed 2000 bytes, with OperationKeyError naming the job" do
    expect { ChargeOrderJob.perform_async("k" * 1990, 1) }
      .to raise_error(IdempotentJob::OperationKeyError, /\AChargeOrderJob: job type and operation key are 2004 bytes/)
    expect { ChargeOrderJob.perform_async("k" * 1986, 1) }.not_to raise_error
  end

  it "refuses at enqueue a key with a NUL character" do
    expect { ChargeOrderJob.perform_async("a\u0000b", 1) }
      .to raise_error(IdempotentJob::OperationKeyError, /ChargeOrderJob: the operation key contains a NUL/)
    expect(ChargeOrderJob.jobs).to be_empty
  end

  it "refuses an empty Array or Hash key like an empty String" do
    [[], {}, ""].each do |empty|
      expect { ChargeOrderJob.perform_async(empty, 1) }
        .to raise_error(IdempotentJob::OperationKeyError, /the value is an empty (Array|Hash|String)/)
    end
  end

  it "refuses a heartbeat that is not true or false, and a lease under 0.25 s" do
    expect { ChargeOrderJob.set(idempotency_heartbeat: "no").perform_async(1, 1) }
      .to raise_error(IdempotentJob::ConfigurationError, /ChargeOrderJob: idempotency_heartbeat must be true or false/)
    expect { ChargeOrderJob.set(idempotency_lease: 0.1).perform_async(1, 1) }
      .to raise_error(IdempotentJob::ConfigurationError, /idempotency_lease must be at least 0.25 s/)
  end

  it "never drops a payload pushed by name (the scheduled poller's push of a perform_in job, a deferral)" do
    ChargeOrderJob.perform_in(60, 42, 1)
    scheduled = ChargeOrderJob.jobs.pop
    # By the time the poller pushes it, the key no longer resolves (a changed declaration,
    # bad data): the push must go through; the worker refuses it, Sidekiq's retry keeps it.
    due = JSON.parse(JSON.generate(scheduled.except("at"))).merge("args" => [nil, 1])
    expect(Sidekiq::Client.push(due)).to eq(scheduled["jid"])
    expect(ChargeOrderJob.jobs.map { |job| job["jid"] }).to eq([scheduled["jid"]])
  end

  it "without the fix: the same payload pushed with its class is refused (the producer's check)" do
    expect { Sidekiq::Client.push("class" => ChargeOrderJob, "args" => [nil, 1]) }
      .to raise_error(IdempotentJob::OperationKeyError)
  end
end
