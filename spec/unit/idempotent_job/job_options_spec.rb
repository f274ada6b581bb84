# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::JobOptions do
  it "resolves a job class's options once and returns the same frozen object after" do
    first = described_class.cached(ChargeOrderJob, { key: :order_id, lease: 30 }, prefix: "idempotency_")
    expect(described_class.cached(ChargeOrderJob, { key: :order_id, lease: 30 }, prefix: "idempotency_"))
      .to equal(first)
    expect(first).to be_frozen
    expect(first).to have_attributes(scope: "ChargeOrderJob", lease: 30, on_stale: :reclaim, heartbeat: true)
  end

  it "honours per-push overrides (other values are another entry) and a new configuration" do
    base = described_class.cached(ChargeOrderJob, { key: :order_id }, prefix: "idempotency_")
    pushed = described_class.cached(ChargeOrderJob, { key: :order_id, lease: 7 }, prefix: "idempotency_")
    expect([base.lease, pushed.lease]).to eq([IdempotentJob.configuration.lease, 7])
    IdempotentJob.configure(lease: 61)
    expect(described_class.cached(ChargeOrderJob, { key: :order_id }, prefix: "idempotency_").lease).to eq(61)
  end

  it "never caches options built with settings that IdempotentJob.configure replaced meanwhile (real threads)" do
    IdempotentJob.configure(lease: 40)
    building = Queue.new
    go_on = Queue.new
    held = false
    allow(described_class).to receive(:new).and_wrap_original do |original, *args, **kwargs|
      built = original.call(*args, **kwargs)
      if args[1] == { key: :order_id } && !held
        held = true
        building << true
        go_on.pop # another thread configures and uses the cache while this build is in hand
      end
      built
    end
    slow = Thread.new { described_class.cached(ChargeOrderJob, { key: :order_id }, prefix: "idempotency_") }
    building.pop
    IdempotentJob.configure(lease: 62)
    described_class.cached(ChargeOrderJob, { key: :order_id, lease: 5 }, prefix: "idempotency_")
    go_on << true
    expect(slow.value.lease).to eq(40) # its caller got what it asked for under the old settings
    expect(described_class.cached(ChargeOrderJob, { key: :order_id }, prefix: "idempotency_").lease).to eq(62)
  end

  it "refuses a heartbeat that is not true or false, naming the job and the option as the door spells it" do
    ["no", 1, "yes", "false", "true"].each do |value|
      expect { described_class.new(ChargeOrderJob, { key: :order_id, heartbeat: value }, prefix: "idempotency_") }
        .to raise_error(IdempotentJob::ConfigurationError,
                        "ChargeOrderJob: idempotency_heartbeat must be true or false, got #{value.inspect}")
    end
    expect(described_class.new(ChargeOrderJob, { key: :order_id, heartbeat: false }).heartbeat).to be(false)
  end

  it "refuses a lease below #{described_class::MIN_LEASE} s" do
    expect { described_class.new("Refund", { lease: 0.2 }) }
      .to raise_error(IdempotentJob::ConfigurationError, /Refund: lease must be at least 0.25 s/)
    expect(described_class.new("Refund", { lease: 0.25 }).lease).to eq(0.25)
  end

  it "refuses unknown option names" do
    expect { described_class.new("Refund", { leese: 3 }) }
      .to raise_error(IdempotentJob::ConfigurationError,
                      /\ARefund: unknown option leese \(did you mean lease\?\); known options: key, scope, lease/)
  end

  it "takes the reclaim budget from the core's table, checked there" do
    expect(described_class.new("Refund", { max_takeovers: 2 }).max_takeovers).to eq(2)
    expect(described_class.new("Refund", {}).max_takeovers).to be_nil
    expect { described_class.new("Refund", { max_takeovers: -1 }, prefix: "idempotency_") }
      .to raise_error(IdempotentJob::ConfigurationError,
                      /\ARefund: idempotency_max_takeovers must be a whole number from 0 to \d+, got -1/)
    expect { described_class.new("Refund", { max_takeover: 2 }, prefix: "idempotency_") }
      .to raise_error(IdempotentJob::ConfigurationError, /did you mean idempotency_max_takeovers\?/)
  end
end
