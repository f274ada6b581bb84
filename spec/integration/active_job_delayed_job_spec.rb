# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"
require_relative "../support/active_job_scenarios"

# ActiveJob jobs on Delayed Job (Debian's ruby-delayed-job and
# ruby-delayed-job-active-record), worked by real DJ worker processes on the same
# PostgreSQL as the idempotency records.
RSpec.describe "ActiveJob on real Delayed Job workers", :integration do
  let(:driver) { ActiveJobWorkers::DelayedJob.new }

  it_behaves_like "ActiveJob replays through real workers", concurrent_workers: :processes

  describe "a worker stopped with raise_signal_exceptions (SignalException raised inside perform)" do
    around { |example| with_adapter(:delayed_job) { driver.around { example.run } } }

    # TERM while the job is in its body, after its effect: Delayed Job raises
    # SignalException in it, counts a failed attempt and reschedules it (about 6 s later);
    # a new worker gets it then.
    def stopped_mid_job(klass)
      pid = driver.start("DJ_RAISE_SIGNAL_EXCEPTIONS" => "term")
      klass.perform_later(49, 100, 2) # lingers 2 s after its effect (under DJ_MAX_RUN_TIME)
      Timeout.timeout(20) { sleep 0.05 until Effects.count(49) == 1 }
      driver.stop(pid)
      yield if block_given?
      successor = driver.start
      expect(driver.wait_until_drained).to be(true), "see #{driver.log}"
      driver.stop(successor)
    end

    it "is a crash: the claim is kept for its lease, and the rescheduled job does not repeat the effect" do
      stopped_mid_job(AjRefundOrderJob) do
        expect(IdempotentJob.record("AjRefundOrderJob", 49)).to have_attributes(status: :claimed, last_error: nil)
      end
      expect(Effects.count(49)).to eq(1)
      expect(IdempotentJob.record("AjRefundOrderJob", 49)).to have_attributes(status: :held, takeovers: 1)
    end

    it "control: without the gem the rescheduled job repeats the effect" do
      stopped_mid_job(AjChargeOrderUnprotectedJob)
      expect(Effects.count(49)).to eq(2)
    end
  end
end
