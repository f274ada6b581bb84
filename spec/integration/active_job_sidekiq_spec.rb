# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_scenarios"

# ActiveJob jobs on Sidekiq's ActiveJob adapter, worked by a real `sidekiq` process:
# claimed once under the job's class, never under the adapter's wrapper class.
RSpec.describe "ActiveJob on a real Sidekiq process", :integration do
  let(:driver) { ActiveJobWorkers::Sidekiq.new }

  it_behaves_like "ActiveJob replays through real workers", concurrent_workers: :threads

  describe "a hard shutdown (Sidekiq raises Sidekiq::Shutdown inside perform)" do
    # A job still in its body (after its effect) when Sidekiq stops with a 1 s timeout:
    # Sidekiq requeues it and raises Sidekiq::Shutdown in it; a new process gets the copy.
    # One thread: an idle one would still be fetching when the job is pushed back, take
    # it, and be killed with it (Sidekiq's basic fetch loses that copy).
    def start_stopping_worker
      driver.start(shutdown_timeout: 1, concurrency: 1)
    end

    def enqueue_lingering(klass)
      driver.deliver(klass.new(49, 100, 4)) # still in its body when the 1 s timeout ends
    end

    it_behaves_like "a worker stopped inside the body", adapter: :sidekiq, copy: "requeued copy"
  end

  it "claims each delivery once, under the job's class, with nothing under the wrapper" do
    with_adapter(:sidekiq) do
      driver.around do
        pid = driver.start
        AjChargeOrderJob.perform_later(48, 100)
        expect(driver.wait_until_drained).to be(true)
        driver.stop(pid)
      end
    end
    rows = Effects.connection.exec("SELECT job_type, operation_key, attempts FROM idempotent_job_records").to_a
    expect(rows).to eq([{ "job_type" => "AjChargeOrderJob", "operation_key" => "48", "attempts" => "1" }])
    expect(Effects.count(48)).to eq(1)
  end
end
