# frozen_string_literal: true

require "spec_helper"
require_relative "../support/sidekiq_processes"

# A real `sidekiq` process on a real Redis, fed duplicate deliveries.
RSpec.describe "A real Sidekiq process", :integration do
  include SidekiqProcesses

  let(:root) { File.expand_path("../..", __dir__) }
  let(:log) { File.join(root, "tmp", "spec-sidekiq.log") }

  def start_sidekiq(env = {})
    Process.spawn({ "REDIS_URL" => ENV.fetch("REDIS_URL") }.merge(env),
                  "sidekiq", "-r", File.join(root, "spec/support/sidekiq_boot.rb"), "-c", "5", "-q", "default",
                  chdir: root, out: log, err: log, pgroup: true)
  end

  # Waits until Redis shows no job left and the block (when given) is true: what the
  # test expects of the database. Redis alone is not enough: Sidekiq 6.4 publishes its
  # busy workers only at its heartbeat (every few seconds), and its scheduled poller
  # takes a due job out of the scheduled set before pushing it to the queue, so a
  # deferred copy coming back can be in neither for a moment; stopping Sidekiq then
  # leaves it unrun (its repeat uncounted).
  def wait_until_drained(timeout: 60, &settled)
    done = -> { drained? && (settled.nil? || settled.call) }
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    sleep 0.5 until done.call || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    expect(done.call).to be(true), "jobs still pending or not settled after #{timeout} s; see #{log}"
  end

  around do |example|
    Sidekiq::Testing.disable! do
      Sidekiq.redis(&:flushdb)
      example.run
    end
  end

  it "runs each operation's effect once despite repeats, identical redeliveries and concurrent copies" do
    pid = start_sidekiq
    begin
      3.times { ChargeOrderJob.perform_async(42, 100) } # repeats: re-enqueued, new jids
      payload = { "class" => "ChargeOrderJob", "args" => [43, 100], "jid" => "same-jid-#{rand(1 << 30)}",
                  "queue" => "default", "idempotency_lease" => 3 }
      2.times { Sidekiq::Client.push(payload) } # identical redelivery, same jid
      Sidekiq::Client.push_bulk("class" => ChargeOrderJob, "args" => Array.new(5) { [44, 100] },
                                "idempotency_lease" => 3) # concurrent copies
      ChargeOrderJob.perform_async(45, 100) # a distinct operation
      wait_until_drained do
        [42, 43, 44, 45].all? { |k| IdempotentJob.record("ChargeOrderJob", k)&.status == :completed } &&
          IdempotentJob.record("ChargeOrderJob", 42).duplicates >= 2
      end
    ensure
      stop_sidekiq(pid)
    end
    expect([42, 43, 44, 45].map { |k| Effects.count(k) }).to eq([1, 1, 1, 1])
    records = [42, 43, 44, 45].map { |k| IdempotentJob.record("ChargeOrderJob", k) }
    expect(records.map(&:status)).to all(eq(:completed))
    # Each copy counted once, however often it met a live claim and came back: 42's two
    # re-enqueues, 43's second push of the same jid, 44's four concurrent copies.
    expect(records.map(&:duplicates)).to eq([2, 1, 4, 0])
    expect(File.read(log)).not_to match(/ERROR|Error:/)
  end

  # The first repeat of QuickUnderLongLeaseJob `key` that is a deferred copy coming back
  # (the repeats report), or nil.
  def deferred_return_of(key)
    operation = IdempotentJob.repeats(job_type: "QuickUnderLongLeaseJob").find { |op| op.operation_key == key.to_s }
    operation&.repeats&.find(&:deferred_return)
  end

  it "brings a duplicate that met a live claim back soon after the holder finishes, not at its lease end" do
    pid = start_sidekiq
    begin
      Sidekiq::Client.push_bulk("class" => QuickUnderLongLeaseJob, "args" => [[77], [77]]) # two copies at once
      wait_until_drained { !deferred_return_of(77).nil? }
    ensure
      stop_sidekiq(pid)
    end
    expect(Effects.count(77)).to eq(1)
    record = IdempotentJob.record("QuickUnderLongLeaseJob", 77)
    # One duplicate met the live claim and was deferred (counted once: its return is the
    # same copy); it came back and found the operation completed — well before the
    # holder's 30 s lease would have ended.
    expect(record).to have_attributes(status: :completed, attempts: 1, duplicates: 1)
    back = deferred_return_of(77)
    expect(back.decision).to eq("completed")
    expect(back.at - record.first_claimed_at).to be < 30
    expect(File.read(log)).to match(/delivery deferred by 1\.0 s \(deferral 1; its lease ends in \d+\.\d s\)/)
  end

  it "keeps a delivery whose claim fails (a role that does not exist) or whose payload has an unknown " \
     "option in Sidekiq's retry set, and runs the first once the worker's URL is fixed" do
    wrong = ENV.fetch("DATABASE_URL").sub("://postgres@", "://noloss_nobody@")
    pid = start_sidekiq("IDEMPOTENT_JOB_SPEC_WORKER_URL" => wrong)
    begin
      ChargeOrderJob.perform_async(46, 100)
      Sidekiq::Client.push("class" => "ChargeOrderJob", "args" => [47, 100], "idempotency_on_stail" => "hold")
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
      sleep 0.2 until Sidekiq::RetrySet.new.size == 2 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    ensure
      stop_sidekiq(pid)
    end
    errors = Sidekiq::RetrySet.new.to_h { |entry| [entry.args.first, entry.item["error_message"]] }
    expect(errors[46]).to match(/\Acannot claim ChargeOrderJob operation "46": role "noloss_nobody" does not exist/)
    expect(errors[47]).to match(/unknown option idempotency_on_stail \(did you mean idempotency_on_stale\?\)/)
    Sidekiq::RetrySet.new.each(&:retry) # what Sidekiq's retry does when the entries are due
    pid = start_sidekiq
    begin
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
      sleep 0.2 until (Effects.count(46) == 1 && Sidekiq::RetrySet.new.size == 1) ||
                      Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    ensure
      stop_sidekiq(pid)
    end
    expect([Effects.count(46), Effects.count(47)]).to eq([1, 0])
    expect(IdempotentJob.record("ChargeOrderJob", 46)).to have_attributes(status: :completed, attempts: 1)
    expect(Sidekiq::RetrySet.new.map { |entry| entry.args.first }).to eq([47]) # still refused, not lost
  end
end
