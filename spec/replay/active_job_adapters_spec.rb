# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_jobs"

# Counts jobs enqueued and not yet performed in this process (the async pool).
module PendingJobs
  @count = 0
  @lock = Mutex.new

  class << self
    attr_reader :count

    def change(delta)
      @lock.synchronize { @count += delta }
    end

    def reset!
      @lock.synchronize { @count = 0 }
    end
  end

  ActiveSupport::Notifications.subscribe(/\A(enqueue|enqueue_at)\.active_job\z/) { change(1) }
  ActiveSupport::Notifications.subscribe("perform.active_job") { change(-1) }
end

# The five replay scenarios through ActiveJob's in-process adapters, :inline (the
# delivery runs in the caller; a copy that meets a live claim waits there) and :async
# (a thread pool; such a copy is re-enqueued with retry_job(wait:)), each with its
# control: the same job without the gem.
RSpec.describe "ActiveJob on the inline and async adapters" do
  before(:context) { SpecOrder.setup! }

  around do |example|
    previous = ActiveJob::Base.queue_adapter
    PendingJobs.reset!
    example.run
  ensure
    ActiveJob::Base.queue_adapter = previous
  end

  def aj_record(key, job_type: "AjChargeOrderJob")
    IdempotentJob.record(job_type, key)
  end

  shared_examples "an in-process adapter" do |adapter|
    before { ActiveJob::Base.queue_adapter = adapter }

    # The same message (same job_id) delivered once more, straight to the adapter
    # (no enqueue event: counted here).
    def deliver(job)
      PendingJobs.change(1)
      ActiveJob::Base.queue_adapter.enqueue(job)
    end

    # Waits for the async pool (and its scheduled re-enqueues) to finish.
    def settle(timeout: 20)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      sleep 0.05 until PendingJobs.count <= 0 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      expect(PendingJobs.count).to be <= 0
    end

    def repeat(klass)
      job = klass.new(42, 100)
      3.times { deliver(job) }
      3.times { klass.perform_later(43, 100) }
      settle
    end

    def at_once(klass)
      job = klass.new(44, 100, 0.5)
      2.times.map { Thread.new { deliver(job) } }.each(&:join)
      settle
    end

    # A forked worker performs the job and is SIGKILLed at `point`; then two copies
    # of the message are delivered here, inside its lease.
    def killed_at(point, klass)
      job = klass.new(47, 100)
      data = job.serialize
      pid, reader = fork_worker do |pipe|
        SpecHooks.on(point) do
          pipe.puts("at #{point}")
          sleep 60
        end
        ActiveJob::Base.execute(data)
      end
      expect(read_line(reader)).to eq("at #{point}")
      kill9(pid)
      yield if block_given?
      2.times { deliver(job) }
      settle
    end

    it "3 deliveries in a row: the effect once" do
      repeat(AjChargeOrderJob)
      expect([Effects.count(42), Effects.count(43)]).to eq([1, 1])
      expect(aj_record(42)).to have_attributes(status: :completed, attempts: 1, duplicates: (2..))
    end

    it "control, 3 in a row without the gem: three times" do
      repeat(AjChargeOrderUnprotectedJob)
      expect([Effects.count(42), Effects.count(43)]).to eq([3, 3])
    end

    it "2 at once (threads): one runs, the other comes back and is skipped" do
      at_once(AjChargeOrderJob)
      expect(Effects.count(44)).to eq(1)
      expect(aj_record(44)).to have_attributes(status: :completed, attempts: 1, duplicates: (1..))
    end

    it "control, 2 at once without the gem: both run" do
      at_once(AjChargeOrderUnprotectedJob)
      expect(Effects.count(44)).to eq(2)
    end

    it "2 distinct operations, one keyed by a GlobalID: each once" do
      orders = [SpecOrder.create!(number: "B-1"), SpecOrder.create!(number: "B-2")]
      [45, 46].each { |id| AjChargeOrderJob.perform_later(id, 100) }
      2.times { AjShipOrderJob.perform_later(orders.first, "ups") }
      AjShipOrderJob.perform_later(orders.last, "ups")
      settle
      expect([45, 46, "B-1/ups", "B-2/ups"].map { |op| Effects.count(op) }).to eq([1, 1, 1, 1])
    end

    it "death after the claim (SIGKILL): the copies inside the lease do not run; then one runs once" do
      killed_at(:before_effect, AjChargeOrderJob) { expect(aj_record(47)).to have_attributes(status: :claimed) }
      expect(Effects.count(47)).to eq(1)
      expect(aj_record(47)).to have_attributes(status: :completed, attempts: 2, takeovers: 1)
    end

    it "control, death after the claim without the gem: both copies run" do
      killed_at(:before_effect, AjChargeOrderUnprotectedJob)
      expect(Effects.count(47)).to eq(2)
    end

    it "death after the effect (SIGKILL) under on_stale: :hold: once, then held" do
      killed_at(:after_effect, AjRefundOrderJob) { expect(Effects.count(47)).to eq(1) }
      expect(Effects.count(47)).to eq(1)
      expect(aj_record(47, job_type: "AjRefundOrderJob")).to have_attributes(status: :held)
    end

    it "control, death after the effect without the gem: the effect repeats" do
      killed_at(:after_effect, AjChargeOrderUnprotectedJob)
      expect(Effects.count(47)).to eq(3)
    end
  end

  describe "inline" do
    it_behaves_like "an in-process adapter", :inline

    def race_processes(klass)
      data = klass.new(44, 100, 0.5).serialize
      gate_reader, gate_writer = IO.pipe
      children = 2.times.map do
        fork_worker do |pipe|
          gate_writer.close
          gate_reader.read(1)
          ActiveJob::Base.execute(data)
          pipe.puts("done")
        end
      end
      gate_reader.close
      sleep 0.2
      gate_writer.close
      children.each do |pid, reader|
        expect(read_line(reader)).to eq("done")
        expect(wait_child(pid)).to be_success
      end
    end

    it "2 at once (processes): one runs, the other waits in place and is skipped" do
      ActiveJob::Base.queue_adapter = :inline
      race_processes(AjChargeOrderJob)
      expect(Effects.count(44)).to eq(1)
      expect(aj_record(44)).to have_attributes(status: :completed, attempts: 1, duplicates: (1..))
    end

    it "control, 2 at once (processes) with the door switched off: both run" do
      ActiveJob::Base.queue_adapter = :inline
      IdempotentJob::ActiveJob.unprotected { race_processes(AjChargeOrderJob) }
      expect(Effects.count(44)).to eq(2)
      expect(aj_record(44)).to be_nil
    end
  end

  describe "async" do
    it_behaves_like "an in-process adapter", :async
  end
end
