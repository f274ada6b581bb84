# frozen_string_literal: true

require "spec_helper"

# Bounds that hold while PostgreSQL accepts connections and never answers (SIGSTOP of the
# postmaster and every backend; issue 29 item 5), through the plain Ruby API: a call with
# `wait: N` returns or raises within N seconds plus the core's margin (WAIT_MARGIN_SECONDS,
# 0.5 s), not the 10 s deadline; after one call spent its deadline the process's circuit
# fails the next at once; once PostgreSQL answers again, calls succeed on their own.
# python/tests/test_outage.py asserts the same of the Python door.
RSpec.describe "PostgreSQL frozen (SIGSTOP) under the plain Ruby API" do
  # The bound asserted: the wait + the core's 0.5 s margin + 1 s for a loaded machine.
  slack = 1.5

  def postgresql_pids
    data = Effects.connection.exec("SHOW data_directory").getvalue(0, 0)
    postmaster = Integer(File.read(File.join(data, "postmaster.pid")).split.first)
    [postmaster, *File.read("/proc/#{postmaster}/task/#{postmaster}/children").split.map(&:to_i)]
  end

  def signal_all(pids, signal)
    pids.each do |pid|
      Process.kill(signal, pid)
    rescue Errno::ESRCH
      nil
    end
  end

  # [what the block returned or raised, seconds it took]
  def timed
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    result = begin
      yield
    rescue IdempotentJob::Error => e
      e
    end
    [result, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  end

  it "ends a call with wait: 2 within the wait and the margin, then the circuit fails fast and recovers" do
    SpecServices.configure_gem!(deadline: 10)
    key = "outage-#{rand(1 << 40)}"
    ran = []
    IdempotentJob.perform_once("Outage", "warm") { nil } # a pooled connection
    pids = postgresql_pids
    begin
      signal_all(pids, :STOP)
      outcome, seconds = timed { IdempotentJob.perform_once("Outage", key, wait: 2) { ran << 1 } }
      # Unbounded, the call ends at the 10 s deadline.
      expect(outcome).to be_a(IdempotentJob::TimeoutError).or be_a(IdempotentJob::ConnectionError)
      expect(outcome).to be_retryable
      expect(seconds).to be <= 2 + slack
      # The circuit is open: the next call fails at once, naming why.
      outcome, seconds = timed { IdempotentJob.perform_once("Outage", key) { ran << 1 } }
      expect(outcome).to be_a(IdempotentJob::ConnectionError)
      expect(outcome.message).to include("circuit open")
      expect(seconds).to be < 0.5
    ensure
      signal_all(pids, :CONT)
    end
    expect(ran).to eq([])
    decision = nil
    20.times do # the circuit's open time (1 s) passes, then one call tries and closes it
      decision = IdempotentJob.perform_once("Outage", "#{key}-after") { ran << 1 }.decision
      break
    rescue IdempotentJob::ConnectionError
      sleep 0.25
    end
    expect(decision).to eq(:ran)
    expect(ran).to eq([1])
    # The abandoned claim statement had reached the frozen server: it may commit when the
    # server resumes, leaving a claim nobody holds (stale after its lease), never a run.
    expect(IdempotentJob.record("Outage", key)&.status).to be_nil.or eq(:claimed)
  end
end
