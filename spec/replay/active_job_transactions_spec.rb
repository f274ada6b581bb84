# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"

# ActiveJob jobs in transactional mode (`transaction: :active_record` / `true`), on the
# inline adapter: the core's transactional strategies, through the ActiveJob door.
RSpec.describe "ActiveJob jobs in transactional mode" do
  around { |example| with_adapter(:inline) { example.run } }

  [AjRecordPaymentJob, AjRecordPaymentNativeJob].each do |klass|
    describe klass.name do
      it "writes the effect once for three deliveries, committed with the completion" do
        job = klass.new("p-1", 500)
        3.times { ActiveJob::Base.execute(job.serialize) }
        expect(SpecPayment.rows("p-1")).to eq(1)
        expect(IdempotentJob.record(klass.name, "p-1")).to have_attributes(status: :completed, duplicates: 2)
      end

      it "rolls the effect back with the claim when the body raises; the retry writes it once" do
        SpecHooks.on(:after_effect) { raise "declined" }
        expect { klass.perform_now("p-2", 500) }.to raise_error(RuntimeError, "declined")
        expect(SpecPayment.rows("p-2")).to eq(0)
        expect(IdempotentJob.record(klass.name, "p-2")).to be_nil
        SpecHooks.reset!
        2.times { klass.perform_now("p-2", 500) }
        expect(SpecPayment.rows("p-2")).to eq(1)
      end

      it "leaves nothing when the worker is SIGKILLed after its write, before the commit" do
        job = klass.new("p-3", 500)
        ActiveJobWorkers::InProcess.new(:inline).crash_at(:after_effect, job)
        ActiveJob::Base.execute(job.serialize) # the redelivery: the dead transaction left no row, no claim
        expect(SpecPayment.rows("p-3")).to eq(1)
        expect(IdempotentJob.record(klass.name, "p-3")).to have_attributes(status: :completed, attempts: 1)
      end

      it "control: without the gem the redeliveries write the effect again" do
        job = klass.new("p-4", 500)
        IdempotentJob::ActiveJob.unprotected { 3.times { ActiveJob::Base.execute(job.serialize) } }
        expect(SpecPayment.rows("p-4")).to eq(3)
      end
    end
  end
end
