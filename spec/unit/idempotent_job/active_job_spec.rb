# frozen_string_literal: true

require "spec_helper"
require_relative "../../support/active_job_jobs"
require_relative "../../support/active_job_workers"

# The ActiveJob door's contract with ActiveJob itself, on ActiveJob's :test adapter
# (enqueued jobs are recorded, not run): declaration checks, what perform sees, the
# re-enqueue of a delivery that meets a live claim, interrupts kept as crashes.
RSpec.describe IdempotentJob::ActiveJob do
  around { |example| with_adapter(:test) { example.run } }

  let(:enqueued) { ActiveJob::Base.queue_adapter.enqueued_jobs }

  def execute(data)
    ActiveJob::Base.execute(data)
  end

  # Another delivery's live claim of the operation (its payload as the door sends it).
  def hold_live_claim(job_type, key)
    payload = [Integer(key)]
    claim(job_type, key, "someone-else", 30, args_digest: IdempotentJob::ArgsDigest.of(payload),
                                             args_json: JSON.generate(payload))
  end

  describe "declaration" do
    def declare(**options)
      Class.new(ActiveJob::Base) do
        def self.name = "DeclaredJob"
        include IdempotentJob::ActiveJob
        idempotency(**options)
        def perform(order_id) = order_id
      end
    end

    it "names the job and the problem for a bad option, at declaration" do
      expect do
        declare(key: :order_id, lease: -1)
      end.to raise_error(IdempotentJob::ConfigurationError, /DeclaredJob: lease/)
      expect { declare(key: :order_id, on_stale: :later) }
        .to raise_error(IdempotentJob::ConfigurationError, /DeclaredJob: on_stale/)
      expect { declare(key: :order_id, idempotency_lease: 5) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /DeclaredJob: unknown option idempotency_lease \(did you mean lease\?\)/)
      expect { declare(lease: 60) }
        .to raise_error(IdempotentJob::ConfigurationError, /DeclaredJob: idempotency needs key: the operation key/)
    end

    it "names a misspelled key option as such, not as a missing key" do
      expect { declare(keys: :order_id) }
        .to raise_error(IdempotentJob::ConfigurationError, /DeclaredJob: unknown option keys \(did you mean key\?\)/)
      expect { declare(idempotency_key: :order_id) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /DeclaredJob: unknown option idempotency_key \(did you mean key\?\)/)
    end

    it "checks a key's parameter name as soon as perform is defined" do
      expect do
        declare(key: :order)
      end.to raise_error(IdempotentJob::OperationKeyError, /DeclaredJob: .*:order.*order_id/)
    end

    it "refuses a class that is not an ActiveJob job" do
      expect { Class.new { include IdempotentJob::ActiveJob } }
        .to raise_error(IdempotentJob::ConfigurationError, /is for ActiveJob classes/)
    end

    it "fails perform_later in the caller when the arguments yield no key" do
      expect { AjChargeOrderJob.perform_later(nil, 100) }
        .to raise_error(IdempotentJob::OperationKeyError, /AjChargeOrderJob: .*the value is nil/)
      expect(enqueued).to be_empty
    end

    it "fails perform_later in the caller for a key over 2000 bytes or with a NUL, as the worker would" do
      expect { AjChargeOrderJob.perform_later("x" * 2000, 100) }
        .to raise_error(IdempotentJob::OperationKeyError, /AjChargeOrderJob: .*more than 2000/)
      expect { AjChargeOrderJob.perform_later("a\0b", 100) }
        .to raise_error(IdempotentJob::OperationKeyError, /AjChargeOrderJob: .*NUL/)
      expect(enqueued).to be_empty
    end
  end

  it "gives perform its operation key, claim and attempt; the job type is the class name" do
    seen = nil
    SpecHooks.on(:inside) do |job|
      seen = [job.idempotency_key, job.idempotency_claim&.job_type, job.idempotency_attempt]
    end
    AjChargeOrderJob.perform_now(42, 100)
    expect(seen).to eq(["42", "AjChargeOrderJob", 1])
    expect(IdempotentJob.record("AjChargeOrderJob", 42)).to have_attributes(status: :completed, jid: be_a(String))
  end

  it "keys by the arguments, never by job_id: a new job_id for the same order is a duplicate" do
    2.times { AjChargeOrderJob.perform_now(42, 100) }
    expect(Effects.count(42)).to eq(1)
    expect(IdempotentJob.record("AjChargeOrderJob", 42).duplicates).to eq(1)
  end

  describe "a delivery that meets a live claim" do
    it "is re-enqueued with retry_job(wait:), not run, not raised, with its executions put back" do
      hold_live_claim("AjRetryingJob", "42")
      job = AjRetryingJob.new(42)
      before = Time.now.to_f
      expect { execute(job.serialize) }.not_to raise_error
      after = Time.now.to_f
      expect(Effects.count(42)).to eq(0)
      expect(enqueued.size).to eq(1)
      copy = enqueued.first
      expect(copy[:job]).to eq(AjRetryingJob)
      expect(copy[:at]).to be_between(before + 1 - 0.01, after + 1 + 0.01) # the first back-off step
      expect(copy).to include("job_id" => job.job_id, "arguments" => [42], "executions" => 0,
                              "idempotency_deferrals" => 1)
    end

    it "does not use up retry_on attempts: a failure, two deferrals, a failure and still one retry left" do
      SpecHooks.on(:after_effect) { raise SpecDeclinedError }
      execute(AjRetryingJob.new(42).serialize) # attempt 1 fails: retry_on re-enqueues it
      retried = enqueued.shift
      data = serialized(retried)
      expect(data).to include("executions" => 1, "exception_executions" => { "[SpecDeclinedError]" => 1 })

      token = hold_live_claim("AjRetryingJob", "42")
      2.times do
        execute(data) # meets the live claim: deferred, counters unchanged
        data = serialized(enqueued.shift)
        expect(data).to include("executions" => 1, "exception_executions" => { "[SpecDeclinedError]" => 1 })
      end
      expect(data["idempotency_deferrals"]).to eq(2)
      RecordRows.fenced(:release, "AjRetryingJob", "42", token[:token], "gave it back")

      # Attempt 2 runs (the deferrals spent none of retry_on's 2 attempts), fails, and
      # only now does retry_on give up.
      expect { execute(data) }.to raise_error(SpecDeclinedError)
      expect(Effects.count(42)).to eq(2)
      expect(enqueued).to be_empty
    end

    it "fails (to the adapter's retry) rather than being lost when an enqueue callback aborts the copy" do
      # A before_enqueue that halts (a uniqueness lock, a feature switch) makes
      # retry_job return false instead of raising: the copy was never enqueued.
      aborting = Class.new(ActiveJob::Base) do
        def self.name = "AjAbortedCopyJob"
        include IdempotentJob::ActiveJob
        idempotency key: :order_id, lease: 2
        before_enqueue { throw :abort if scheduled_at }
        def perform(order_id) = Effects.record("aborted-copy", order_id)
      end
      stub_const("AjAbortedCopyJob", aborting)
      hold_live_claim("AjAbortedCopyJob", "42")
      expect { execute(aborting.new(42).serialize) }
        .to raise_error(IdempotentJob::Error, /AjAbortedCopyJob operation "42" .*was not enqueued/)
      expect(Effects.count(42)).to eq(0)
      expect(enqueued).to be_empty
    end

    # The serialized job the test adapter recorded (its String keys).
    def serialized(enqueued_job)
      enqueued_job.select { |name, _| name.is_a?(String) }
    end
  end

  describe "an interrupt of the worker" do
    it "keeps the claim for its lease (Sidekiq::Shutdown, Interrupt), where an error releases it" do
      SpecHooks.on(:after_effect) { raise Sidekiq::Shutdown }
      expect { AjChargeOrderJob.perform_now(42, 100) }.to raise_error(Sidekiq::Shutdown)
      expect(IdempotentJob.record("AjChargeOrderJob", 42)).to have_attributes(status: :claimed, last_error: nil)

      SpecHooks.on(:after_effect) { raise Interrupt }
      expect { AjChargeOrderJob.perform_now(43, 100) }.to raise_error(Interrupt)
      expect(IdempotentJob.record("AjChargeOrderJob", 43)).to have_attributes(status: :claimed)

      SpecHooks.on(:after_effect) { raise "card declined" }
      expect { AjChargeOrderJob.perform_now(44, 100) }.to raise_error(RuntimeError)
      expect(IdempotentJob.record("AjChargeOrderJob", 44)).to have_attributes(status: :released)
    end
  end

  it "runs a job whose enqueued_at is a Time (ActiveJob 7.1+), keeping it as ISO 8601 text in the facts" do
    job = AjChargeOrderJob.new(42, 100)
    job.enqueued_at = Time.utc(2026, 12, 4, 22, 10, 6, 123_456) # what ActiveJob 7.1+ deserializes
    job.perform_now
    expect(Effects.count(42)).to eq(1)
    stored = Effects.connection.exec("SELECT first_facts->>'enqueued_at' FROM idempotent_job_records " \
                                     "WHERE job_type = 'AjChargeOrderJob' AND operation_key = '42'").getvalue(0, 0)
    expect(stored).to eq("2026-12-04T22:10:06.123456Z")
  end

  it "re-enqueues a held operation resolved with as: :rerun, with its arguments, on its queue" do
    SpecHooks.on(:after_effect) { raise Interrupt }
    expect { AjRefundOrderJob.perform_now(42, 100) }.to raise_error(Interrupt)
    SpecHooks.reset!
    sleep 2.1 # the lease ends; the next delivery takes the stale claim over and holds it
    AjRefundOrderJob.perform_now(42, 100)
    expect(IdempotentJob.record("AjRefundOrderJob", 42).status).to eq(:held)
    IdempotentJob.resolve("AjRefundOrderJob", 42, as: :rerun)
    expect(enqueued.map do |job|
             [job[:job], job[:args], job[:queue]]
           end).to eq([[AjRefundOrderJob, [42, 100], "default"]])
  end
end
