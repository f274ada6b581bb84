# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"
require_relative "../support/active_job_scenarios"

# ActiveJob jobs on Sidekiq's ActiveJob adapter, worked by a real `sidekiq` process:
# claimed once under the job's class, never under the adapter's wrapper class.
RSpec.describe "ActiveJob on a real Sidekiq process", :integration do
  let(:driver) { ActiveJobWorkers::Sidekiq.new }

  it_behaves_like "ActiveJob replays through real workers", concurrent_workers: :threads

  it "claims each delivery once, under the job's class, with nothing under the wrapper" do
    ActiveJob::Base.queue_adapter = :sidekiq
    Sidekiq::Testing.disable! do
      Sidekiq.redis(&:flushdb)
      pid = driver.start
      AjChargeOrderJob.perform_later(48, 100)
      expect(driver.wait_until_drained).to be(true)
      driver.stop(pid)
    end
    rows = Effects.connection.exec("SELECT job_type, operation_key, attempts FROM idempotent_job_records").to_a
    expect(rows).to eq([{ "job_type" => "AjChargeOrderJob", "operation_key" => "48", "attempts" => "1" }])
    expect(Effects.count(48)).to eq(1)
  ensure
    ActiveJob::Base.queue_adapter = :inline
  end
end
