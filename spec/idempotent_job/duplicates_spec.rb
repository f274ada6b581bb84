# frozen_string_literal: true

require "spec_helper"
require "json"
require "timeout"

# The read-only duplicate decision and the asynchronous repeat bookkeeping (issue 14),
# against a real PostgreSQL, with real threads and processes.
RSpec.describe "Duplicate deliveries" do
  def request(key, jid, **extra)
    { job_type: "Dup", operation_key: key, jid:, lease: 30.0, job_class: "DupJob", args_digest: "a", **extra }
  end

  # A claim as one delivery's claim statement makes it ({RecordRows}: no body run).
  def deliver(key, jid, **extra)
    RecordRows.claim(request(key, jid, **extra))
  end

  def repeat_facts(key)
    JSON.parse(Effects.connection.exec_params(
      "SELECT repeat_facts::text FROM idempotent_job_records WHERE job_type = 'Dup' AND operation_key = $1", [key]
    ).getvalue(0, 0))
  end

  # The child's own connections, named so the parent can wait for their backends.
  def child_store!
    SpecServices.configure_gem!(database_url: "#{SpecServices.database_url}?application_name=killed-child")
  end

  # A batch the killed child had already sent still commits: wait until its backends
  # have read everything and exited.
  def wait_for_child_backends
    Timeout.timeout(10) do
      sleep 0.01 while Effects.connection.exec(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'killed-child'"
      ).getvalue(0, 0).to_i.positive?
    end
  end

  describe "the decision" do
    it "turns a duplicate of a completed operation away without a lock or a write, even while its row is locked" do
      key = unique_key
      first = deliver(key, "j1")
      complete("Dup", key, first[:token])
      with_row_locked("Dup", key) do
        # The claim statement would wait for the row lock; the read-only look does not.
        decision = Timeout.timeout(2) { deliver_once("Dup", key) }
        expect(decision).to have_attributes(decision: :completed, duplicates: 1)
      end
    end

    it "answers a duplicate that races the first claim's uncommitted insert from that claim's outcome" do
      [true, false].each do |commit|
        key = unique_key
        claimed = Queue.new
        finish = Queue.new
        # The first delivery's claim, uncommitted in its transaction while the body waits.
        first = Thread.new do
          IdempotentJob.perform_once("Dup", key, transaction: true, lease: 30) do |claim|
            claimed << claim
            raise "rolled back" unless finish.pop
          end
        rescue RuntimeError => e
          e
        end
        expect(claimed.pop).to have_attributes(kind: :first, attempt: 1)
        # The look sees nothing; the claim waits on the insert.
        racer = Thread.new { deliver_once("Dup", key) { |claim| claim } }
        sleep 0.3
        expect(racer).to be_alive
        finish << commit # the body returns (completion, commit) or raises (rollback)
        if commit
          expect(first.value).to have_attributes(decision: :ran)
          expect(racer.value).to have_attributes(decision: :completed)
        else
          expect(first.value.message).to eq("rolled back")
          expect(racer.value.value).to have_attributes(kind: :first, attempt: 1)
        end
      ensure
        # A failed expectation must not leave the row and table locked for later examples.
        finish&.<<(false) if first&.alive?
        first&.join
      end
    end

    it "gives exactly one of many concurrent first deliveries the claim (10 threads, 20 operations)" do
      keys = Array.new(20) { unique_key }
      gate = Queue.new
      threads = Array.new(10) do |t|
        Thread.new do
          gate.pop
          keys.map { |key| deliver(key, "j#{t}")[:decision] }
        end
      end
      10.times { gate << :go }
      per_key = threads.map(&:value).transpose
      per_key.each { |decisions| expect(decisions.tally).to eq(claimed: 1, in_progress: 9) }
      keys.each do |key|
        expect(IdempotentJob.record("Dup", key)).to have_attributes(status: :claimed, attempts: 1, duplicates: 9)
      end
    end
  end

  describe "the bookkeeping" do
    it "records each repeat off the decision's path: counts, times, classes and the door's facts" do
      key = unique_key
      first = deliver(key, "j1", facts_json: '{"delivery":"d1"}')
      deliver(key, "j2", facts_json: '{"delivery":"d2","retry_count":0}')
      complete("Dup", key, first[:token])
      deliver(key, "j3", job_class: "OtherJob", facts_json: '{"delivery":"d3"}')
      deliver(key, "j4", args_digest: "b")
      record = IdempotentJob.record("Dup", key)
      expect(record).to have_attributes(duplicates: 3, mismatches: 1, last_mismatch: true, status: :completed)
      expect(record.last_duplicate_at).to be_within(5).of(Time.now)
      facts = repeat_facts(key)
      expect(facts.map { |f| [f["decision"], f["job_class"], f["facts"]] }).to eq(
        [["in_progress", "DupJob", { "delivery" => "d2", "retry_count" => 0 }],
         ["completed", "OtherJob", { "delivery" => "d3" }],
         ["completed", "DupJob", nil]]
      )
      repeated = IdempotentJob.repeats(since: Time.now - 60, job_type: "Dup").find { |op| op.operation_key == key }
      expect(repeated.repeats.size).to eq(3)
      expect(repeated.job_classes).to contain_exactly("DupJob", "OtherJob")
    end

    it "keeps the last 20 repeats' facts" do
      key = unique_key
      deliver(key, "j0")
      25.times { |i| deliver(key, "j#{i + 1}", facts_json: JSON.generate(n: i)) }
      expect(IdempotentJob.record("Dup", key).duplicates).to eq(25)
      expect(repeat_facts(key).map { |f| f["facts"]["n"] }).to eq((5...25).to_a)
    end

    it "rejects delivery facts that are not a JSON object, naming the job and showing at most 100 characters" do
      expect { deliver(unique_key, "j", facts_json: "[1]") }
        .to raise_error(IdempotentJob::ConfigurationError, /\ADup: the delivery facts must be a JSON object/)
      expect { deliver(unique_key, "j", facts_json: "[#{"1," * 100_000}1]") }
        .to raise_error(IdempotentJob::ConfigurationError) { |e| expect(e.message.length).to be < 300 }
    end

    it "writes a replaced pool's queued bookkeeping when the gem is reconfigured or reset" do
      [-> { SpecServices.configure_gem!(pool_size: 3) }, -> { IdempotentJob.reset! }].each do |replace|
        SpecServices.configure_gem!
        key = unique_key
        complete("Dup", key, deliver(key, "j0")[:token])
        30.times { |i| deliver(key, "r#{i}") }
        replace.call
        counted = Effects.connection.exec_params(
          "SELECT duplicates FROM idempotent_job_records WHERE job_type = 'Dup' AND operation_key = $1", [key]
        ).getvalue(0, 0).to_i
        expect(counted).to eq(30)
      end
    end

    it "loses at most a killed process's unwritten bookkeeping, never a decision" do
      key = unique_key
      first = deliver(key, "j1")
      complete("Dup", key, first[:token])
      pid, reader = fork_worker do |pipe|
        child_store!
        30.times { |i| deliver(key, "c#{i}") }
        pipe.puts("sent")
        Process.kill(:KILL, Process.pid) # no time to write what is queued
      end
      expect(read_line(reader)).to eq("sent")
      Process.wait(pid)
      wait_for_child_backends
      record = IdempotentJob.record("Dup", key)
      expect(record).to have_attributes(status: :completed, claim_token: first[:token], attempts: 1)
      expect(record.duplicates).to be_between(0, 30)
      lost = 30 - record.duplicates

      pid, reader = fork_worker do |pipe|
        child_store!
        30.times { |i| deliver(key, "s#{i}") }
        IdempotentJob.store.settle_repeats
        pipe.puts("settled")
        Process.kill(:KILL, Process.pid)
      end
      expect(read_line(reader)).to eq("settled")
      Process.wait(pid)
      expect(IdempotentJob.record("Dup", key).duplicates).to eq(60 - lost)
    end
  end
end
