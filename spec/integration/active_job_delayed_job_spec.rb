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
end
