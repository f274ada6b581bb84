# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_scenarios"

# ActiveJob jobs on Delayed Job (Debian's ruby-delayed-job and
# ruby-delayed-job-active-record), worked by real DJ worker processes on the same
# PostgreSQL as the idempotency records.
RSpec.describe "ActiveJob on real Delayed Job workers", :integration do
  let(:driver) { ActiveJobWorkers::DelayedJob.new }

  it_behaves_like "ActiveJob replays through real workers", concurrent_workers: :processes

  describe "a worker stopped with raise_signal_exceptions (SignalException raised inside perform)" do
    # TERM while the job is in its body, after its effect: Delayed Job raises
    # SignalException in it, counts a failed attempt and reschedules it (about 6 s later);
    # a new worker gets it then.
    def start_stopping_worker
      driver.start("DJ_RAISE_SIGNAL_EXCEPTIONS" => "term")
    end

    def enqueue_lingering(klass)
      klass.perform_later(49, 100, 2) # lingers 2 s after its effect (under DJ_MAX_RUN_TIME)
    end

    it_behaves_like "a worker stopped inside the body", adapter: :delayed_job, copy: "rescheduled job"
  end
end
