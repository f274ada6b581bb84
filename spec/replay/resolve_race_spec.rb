# frozen_string_literal: true

require "spec_helper"
require_relative "../support/web_records"

# IdempotentJob.resolve settles an operation in one statement (the core's resolve, whose
# WHERE is the only test of which statuses settle) and answers the record that statement
# left: nothing another thread does between a read and the change, or after the change,
# can make it act on or report a record it did not settle. Real threads, one real
# PostgreSQL; the interleavings are made with a row lock held in another session.
RSpec.describe "IdempotentJob.resolve racing other threads" do
  let(:job_type) { web_job_type("ResolveRace") }

  # A session of its own that watches which of the gem's resolves wait for a row lock.
  def resolves_waiting(watcher)
    watcher.exec("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' " \
                 "AND query LIKE '%resolution = $3%'").getvalue(0, 0).to_i
  end

  def wait_until(what)
    give_up = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    until yield
      raise "gave up waiting until #{what}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > give_up

      sleep 0.01
    end
  end

  it "two people resolving at once: one settles it, the other is told the status it lost to (not :held)" do
    web_stopped(job_type, "7")
    watcher = PG.connect(SpecServices.database_url)
    outcomes = Queue.new
    resolver = lambda do |as|
      Thread.new do
        outcomes << [as, IdempotentJob.resolve(job_type, "7", as:)]
      rescue IdempotentJob::Error => e
        outcomes << [as, e]
      end
    end
    threads = []
    with_row_locked(job_type, "7") do
      # The rerun's statement waits first, so it is first in line for the row; the
      # other resolve (which the two-step code let read the record as :held) behind it.
      threads << resolver.call(:rerun)
      wait_until("the first resolve waits for the row") { resolves_waiting(watcher) == 1 }
      threads << resolver.call(:done)
      wait_until("both resolves wait for the row") { resolves_waiting(watcher) == 2 }
    end
    threads.each(&:join)
    results = Array.new(2) { outcomes.pop }.to_h

    expect(results[:rerun]).to be_a(IdempotentJob::Record)
    expect(results[:rerun]).to have_attributes(status: :released, resolution: "rerun", operation_key: "7")
    expect(results[:done]).to be_a(IdempotentJob::Error)
    expect(results[:done].message)
      .to eq(%(#{job_type} operation "7" is not held or given up (status: :released)))
    expect(IdempotentJob.record(job_type, "7")).to have_attributes(status: :released, resolution: "rerun")
  ensure
    watcher&.close
  end

  it "answers the record it released, though the re-sent delivery claimed it before resolve returned" do
    web_stopped(job_type, "8")
    claimed = Queue.new
    finish = Queue.new
    sent = []
    rerun_delivery = nil
    IdempotentJob.on_rerun do |record|
      next false unless record.job_type == job_type

      sent << record
      # A worker thread picks the re-sent delivery up at once and claims it (as a retry).
      rerun_delivery = Thread.new do
        IdempotentJob.perform_once(job_type, record.operation_key, lease: 30) do |claim|
          claimed << claim.kind
          finish.pop
        end
      end
      expect(claimed.pop).to eq(:retry)
      true
    end
    resolved = IdempotentJob.resolve(job_type, "8", as: :rerun)
    expect(resolved).to have_attributes(status: :released, resolution: "rerun", attempts: 2)
    expect(sent.map { |r| [r.status, r.job_class, r.queue, r.args] })
      .to eq([[:released, "WebSpecJob", "critical", ["8"]]])
    expect(IdempotentJob.record(job_type, "8")).to have_attributes(status: :claimed, last_claim: :retry, attempts: 3)
    finish << true
    expect(rerun_delivery.value).to have_attributes(decision: :ran)
    expect(IdempotentJob.record(job_type, "8")).to have_attributes(status: :completed, resolution: "rerun")
  ensure
    finish << true
    rerun_delivery&.join
    IdempotentJob.instance_variable_set(:@rerun_senders, [])
  end
end
