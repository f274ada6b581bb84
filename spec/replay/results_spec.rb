# frozen_string_literal: true

require "spec_helper"
require "json"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"

# A Sidekiq job that stores its return value (the Sidekiq door has no return value to
# give a repeat; the record and the event show the replay).
class ResultChargeSidekiqJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_store_result: true

  def perform(order_id)
    Effects.record("sidekiq-result", order_id)
    { "charge_id" => "ch_#{order_id}" }
  end
end

# An ActiveJob job that stores its return value: perform_now of a repeat returns it.
class ResultChargeActiveJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :order_id, store_result: true

  def perform(order_id)
    Effects.record("aj-result", order_id)
    { "charge_id" => "ch_#{order_id}", "cents" => 1500 }
  end
end

# The same ActiveJob job without store_result.
class ResultlessActiveJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :order_id

  def perform(order_id)
    Effects.record("aj-resultless", order_id)
    "ran #{order_id}"
  end
end

# Stored results and replays (issue 23) through each Ruby door, and `wait:`.
RSpec.describe "Stored results and replays" do
  include Processes

  def charge(key = 42, **options, &)
    IdempotentJob.perform_once("ResultCharge", key, lease: 30, **options, &)
  end

  def logged
    @logged ||= StringIO.new
  end

  def events
    @events ||= []
  end

  before do
    SpecServices.configure_gem!(logger: Logger.new(logged))
    @handles = [IdempotentJob.subscribe(:skipped, :completed, :result_not_stored) { |*event| events << event }]
  end

  after { @handles.each { |h| IdempotentJob::Events.unsubscribe(h) } }

  # The value a fresh process (a forked child: its own pool and connections) replays.
  def replayed_in_a_fresh_process(&call)
    pid, reader = fork_worker do |pipe|
      outcome = call.call
      pipe.puts(JSON.generate([outcome.decision, outcome.replayed?, outcome.value]))
    end
    line = read_line(reader)
    expect(wait_child(pid)).to be_success
    JSON.parse(line)
  end

  describe "IdempotentJob.perform_once (plain Ruby)" do
    it "stores the block's value with the completion; a repeat replays it, in this process and a fresh one" do
      first = charge(store_result: true) { { charge_id: "ch_1", amounts: [1500, 2.5] } }
      expect(first).to have_attributes(decision: :ran, value: { charge_id: "ch_1", amounts: [1500, 2.5] },
                                       result_stored?: true, replayed?: false)
      again = charge(store_result: true) { raise "not run" }
      expect(again).to have_attributes(decision: :completed, replayed?: true, result_stored?: true,
                                       value: { "charge_id" => "ch_1", "amounts" => [1500, 2.5] })
      # Without store_result on the repeat: what the completion stored is still replayed.
      expect(charge { raise "not run" }.value).to eq("charge_id" => "ch_1", "amounts" => [1500, 2.5])
      expect(replayed_in_a_fresh_process { charge { raise "not run" } })
        .to eq(["completed", true, { "charge_id" => "ch_1", "amounts" => [1500, 2.5] }])
      expect(IdempotentJob.record("ResultCharge", 42))
        .to have_attributes(result: { "charge_id" => "ch_1", "amounts" => [1500, 2.5] }, result_state: :stored)
      expect(logged.string).to include("replayed: true")
      skipped = events.select { |name, _| name == :skipped }.map(&:last)
      expect(skipped).to all(include(replayed: true, result_state: :stored))
    end

    it "stores scalars and nil as they are: a replay tells a stored nil from no value" do
      charge(1, store_result: true) { "plain text" }
      charge(2, store_result: true) { nil }
      expect(charge(1) { raise "not run" }).to have_attributes(value: "plain text", result_stored?: true)
      expect(charge(2) { raise "not run" }).to have_attributes(value: nil, result_stored?: true, replayed?: true)
    end

    it "without store_result a repeat has no value and is not a replay" do
      expect(charge { "the value" }).to have_attributes(decision: :ran, value: "the value", result_stored?: false)
      again = charge(store_result: true) { raise "not run" }
      expect(again).to have_attributes(decision: :completed, value: nil, replayed?: false, result_stored?: false,
                                       result_state: nil)
      expect(IdempotentJob.record("ResultCharge", 42)).to have_attributes(result: nil, result_state: nil)
      expect(events.find { |name, _| name == :skipped }.last).not_to include(:replayed)
    end

    {
      "too large" => [-> { "x" * 70_000 }, :too_large, "over max_result_bytes (65536)"],
      "not JSON-encodable" => [-> { { "at" => Time.now } }, :unencodable, "cannot be encoded as JSON (a Time)"]
    }.each do |what, (value, state, why)|
      it "completes a #{what} result without storing it: warned, an event, a repeat learns it and never runs" do
        runs = 0
        first = charge(store_result: true) { runs += 1; value.call } # rubocop:disable Style/Semicolon
        expect(first).to have_attributes(decision: :ran, result_state: state, result_stored?: false)
        expect(IdempotentJob.record("ResultCharge", 42)).to have_attributes(status: :completed, result: nil,
                                                                            result_state: state)
        expect(logged.string).to match(/WARN.*ResultCharge operation "42" completed, but its result was not stored/)
        expect(logged.string).to include(why)
        expect(events.map(&:first)).to include(:result_not_stored)
        expect(events.find { |name, _| name == :result_not_stored }.last).to include(result_state: state)
        again = charge(store_result: true) { runs += 1 }
        expect(again).to have_attributes(decision: :completed, replayed?: false, result_stored?: false, value: nil,
                                         result_state: state, label: :skipped)
        expect(runs).to eq(1)
      end
    end

    describe "wait:" do
      # A holder running the body on its own thread until `finish` is pushed; returns
      # the thread (its value: the holder's outcome, or what it raised).
      def holder(started, finish, key: 42, &result)
        Thread.new do
          Thread.current.report_on_exception = false
          charge(key, store_result: true) do
            started << true
            finish.pop
            result.call
          end
        end
      end

      it "a waiter gets the running call's value once it completes (LISTEN/NOTIFY)" do
        started = Queue.new
        finish = Queue.new
        running = holder(started, finish) { { "charge_id" => "ch_w" } }
        started.pop
        waiter = Thread.new { charge(store_result: true, wait: 30) { raise "the waiter must not run" } }
        sleep(0.01) until logged.string.include?("waiting up to 30.0 s") || !waiter.alive?
        finish << true
        expect(running.value).to have_attributes(decision: :ran, label: :ran, waited?: false)
        expect(waiter.value).to have_attributes(decision: :completed, replayed?: true, value: { "charge_id" => "ch_w" },
                                                waited?: true, label: :waited)
        expect(charge { raise "not run" }).to have_attributes(label: :replayed, waited?: false)
      end

      it "a wait shorter than the run ends :in_progress, and the body never runs twice" do
        started = Queue.new
        finish = Queue.new
        runs = Queue.new
        running = holder(started, finish) { runs << :holder and 1 }
        started.pop
        waited = charge(store_result: true, wait: 0.2) { runs << :waiter }
        expect(waited).to have_attributes(decision: :in_progress, replayed?: false, waited?: true, label: :in_progress)
        expect(waited.lease_remaining).to be > 0
        finish << true
        running.join
        expect(runs.size).to eq(1)
      end

      it "a holder that raises lets the waiter claim and run" do
        started = Queue.new
        finish = Queue.new
        running = holder(started, finish) { raise ArgumentError, "declined" }
        started.pop
        waiter = Thread.new { charge(store_result: true, wait: 30) { |claim| "ran as #{claim.kind}" } }
        sleep(0.01) until logged.string.include?("waiting up to 30.0 s") || !waiter.alive?
        finish << true
        expect { running.join }.to raise_error(ArgumentError, "declined")
        expect(waiter.value).to have_attributes(decision: :ran, value: "ran as retry", waited?: true, label: :ran)
        expect(charge { raise "not run" }).to have_attributes(replayed?: true, value: "ran as retry")
      end

      it "gives up a wait on Timeout (Thread#raise) at once, and the pool serves the next call" do
        started = Queue.new
        finish = Queue.new
        running = holder(started, finish) { "held" }
        started.pop
        began = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        expect { Timeout.timeout(0.3) { charge(wait: 60) { raise "the waiter must not run" } } }
          .to raise_error(Timeout::Error)
        interrupted_after = Process.clock_gettime(Process::CLOCK_MONOTONIC) - began
        finish << true
        expect(running.value).to have_attributes(decision: :ran)
        expect(charge { raise "not run" }).to have_attributes(replayed?: true, value: "held")
        puts "\n    a wait: interrupted by Timeout after #{interrupted_after.round(2)} s (timeout 0.3 s)"
      end

      it "refuses a bad wait: and wait: with transaction:" do
        # The core's wording and range (issue 30 item L: Ruby said "wait: must be ... >= 0" with no maximum).
        [-1, 315_360_001, Float::NAN, "5"].each do |wait|
          shown = Regexp.escape(wait.inspect)
          message = /\AResultCharge: wait must be a number of seconds from 0 to 315360000, got #{shown}\z/
          expect { charge(wait:) { 1 } }.to raise_error(IdempotentJob::ConfigurationError, message)
        end
        expect { charge(wait: 1, transaction: true) { 1 } }
          .to raise_error(IdempotentJob::ConfigurationError, /wait: cannot be combined with transaction:/)
      end
    end

    it "stores the result inside a transactional claim, with its commit (native and ActiveRecord)" do
      charge(store_result: true, transaction: true) { [1, "two"] }
      expect(charge { raise "not run" }).to have_attributes(replayed?: true, value: [1, "two"])
      charge(43, store_result: true, transaction: :active_record) { { "via" => "active_record" } }
      expect(charge(43, transaction: :active_record) { raise "not run" })
        .to have_attributes(decision: :completed, replayed?: true, value: { "via" => "active_record" })
      charge(44, store_result: true, transaction: :active_record) { Time.now }
      # Not stored: no replay (the core's one rule, Outcome::replayed), a skipped repeat.
      expect(charge(44) { raise "not run" })
        .to have_attributes(replayed?: false, result_state: :unencodable, label: :skipped)
    end
  end

  describe "Sidekiq (idempotency_store_result)" do
    include ReplayHelpers

    it "stores perform's value; a repeat is skipped as a replay (the door has no value to give)" do
      job = job_hash([7], klass: ResultChargeSidekiqJob)
      2.times { deliver(job.dup) }
      expect(Effects.count(7)).to eq(1)
      expect(IdempotentJob.record("ResultChargeSidekiqJob", "7"))
        .to have_attributes(status: :completed, result: { "charge_id" => "ch_7" }, result_state: :stored)
      expect(events.find { |name, _| name == :skipped }.last).to include(replayed: true)
      expect(replayed_in_a_fresh_process { IdempotentJob.perform_once("ResultChargeSidekiqJob", 7) { raise "no" } })
        .to eq(["completed", true, { "charge_id" => "ch_7" }])
    end
  end

  describe "ActiveJob (idempotency store_result: true)" do
    around { |example| with_adapter(:inline) { example.run } }

    it "perform_now of a repeat returns the stored value, in this process and a fresh one" do
      expect(ResultChargeActiveJob.perform_now(9)).to eq("charge_id" => "ch_9", "cents" => 1500)
      expect(ResultChargeActiveJob.perform_now(9)).to eq("charge_id" => "ch_9", "cents" => 1500)
      expect(Effects.count(9)).to eq(1)
      pid, reader = fork_worker { |pipe| pipe.puts(JSON.generate(ResultChargeActiveJob.perform_now(9))) }
      expect(JSON.parse(read_line(reader))).to eq("charge_id" => "ch_9", "cents" => 1500)
      expect(wait_child(pid)).to be_success
      expect(Effects.count(9)).to eq(1)
    end

    it "without store_result, perform_now of a repeat returns nil" do
      expect(ResultlessActiveJob.perform_now(5)).to eq("ran 5")
      expect(ResultlessActiveJob.perform_now(5)).to be_nil
    end
  end
end
