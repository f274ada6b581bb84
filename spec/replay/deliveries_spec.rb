# frozen_string_literal: true

require "spec_helper"

# Replays the deliveries an at-least-once queue makes, through Sidekiq's testing
# harness against a real PostgreSQL. Every scenario runs twice: with the middleware
# (the effect happens once) and without it (the control: the duplicates do happen,
# so these specs can fail).
RSpec.describe "Replaying deliveries of one operation" do
  describe "the same message delivered three times in a row" do
    it "runs the effect once; the repeats are counted as duplicates" do
      job = job_hash
      3.times { deliver(job) }
      expect(Effects.count(42)).to eq(1)
      expect(record).to have_attributes(status: :completed, attempts: 1, duplicates: 2)
    end

    it "also when each repeat is a re-enqueue with a new jid" do
      3.times { ChargeOrderJob.perform_async(42, 1500) }
      ChargeOrderJob.drain
      expect(Effects.count(42)).to eq(1)
    end

    it "control: without the middleware the effect happens three times" do
      without_middleware!
      job = job_hash
      3.times { deliver(job) }
      expect(Effects.count(42)).to eq(3)
    end
  end

  describe "the same message delivered to two workers at once" do
    def race_threads(job)
      ready = Queue.new
      go = Queue.new
      SpecHooks.on(:after_effect) { sleep 0.3 } # the first holder is still working
      threads = 2.times.map do
        Thread.new do
          ready << true
          go.pop
          deliver(job)
        end
      end
      2.times { ready.pop }
      2.times { go << true }
      threads.each(&:join)
    end

    it "threads: one runs the effect, the other is deferred (first back-off step, not the whole lease), then skipped" do
      job = job_hash
      before = Time.now.to_f
      race_threads(job)
      after = Time.now.to_f
      expect(Effects.count(42)).to eq(1)
      deferred = ChargeOrderJob.jobs
      expect(deferred.size).to eq(1)
      # The holder's lease is 30 s; the first deferral comes back 1 s after it was made
      # (somewhere inside the race), not at the lease's end.
      expect(deferred.first["at"]).to be_between(before + 1 - 0.01, after + 1 + 0.01)
      expect(deferred.first).to include("jid" => job["jid"], "idempotency_deferrals" => 1)
      ChargeOrderJob.drain # the deferred delivery arrives later: the operation is completed
      expect(Effects.count(42)).to eq(1)
      # One copy turned away, counted when it met the live claim; its return after the
      # completion is the same copy (deferrals 1): a repeat, not a second duplicate.
      expect(record).to have_attributes(status: :completed, attempts: 1, duplicates: 1)
      expect(IdempotentJob.repeats(job_type: "ChargeOrderJob").first.repeats.map(&:deferred_return))
        .to eq([false, true])
    end

    it "control threads: without the middleware both run the effect" do
      without_middleware!
      race_threads(job_hash)
      expect(Effects.count(42)).to eq(2)
    end

    it "processes: one runs the effect, the other is turned away and deferred" do
      outcomes = race_processes(job_hash, hold: 0.3) { "deferred=#{ChargeOrderJob.jobs.size}" }
      expect(Effects.count(42)).to eq(1)
      expect(outcomes.sort).to eq(%w[deferred=0 deferred=1])
      expect(record).to have_attributes(status: :completed, attempts: 1, duplicates: 1)
    end

    it "control processes: without the middleware both run the effect" do
      without_middleware!
      race_processes(job_hash, hold: 0.3) { "deferred=#{ChargeOrderJob.jobs.size}" }
      expect(Effects.count(42)).to eq(2)
    end
  end

  describe "a worker that dies (SIGKILL) after its claim, before the effect" do
    let(:lease) { 1.5 }

    it "keeps redeliveries inside the lease from running; after the lease one runs" do
      job = job_hash("idempotency_lease" => lease)
      kill_worker_at(:before_effect, job)
      expect(record).to have_attributes(status: :claimed, attempts: 1)

      deliver(job) # inside the lease: deferred, not run, not lost
      expect(Effects.count(42)).to eq(0)
      expect(ChargeOrderJob.jobs.size).to eq(1)

      wait_for_lease_end(lease)
      deliver(ChargeOrderJob.jobs.shift) # the deferred delivery, after the lease
      deliver(job) # and one more repeat for good measure
      expect(Effects.count(42)).to eq(1)
      expect(record).to have_attributes(status: :completed, attempts: 2, takeovers: 1, last_claim: :takeover)
    end

    it "control: without the middleware both redeliveries run the effect" do
      without_middleware!
      job = job_hash
      kill_worker_at(:before_effect, job)
      2.times { deliver(job) }
      expect(Effects.count(42)).to eq(2)
    end
  end

  describe "a worker that dies (SIGKILL) after the effect, before completion" do
    let(:lease) { 1.5 }

    it "under the default :reclaim policy runs once more after the lease: the documented duplicate" do
      job = job_hash("idempotency_lease" => lease)
      kill_worker_at(:after_effect, job)
      expect(Effects.count(42)).to eq(1)
      expect(record).to have_attributes(status: :claimed)

      deliver(job) # inside the lease: not run
      expect(Effects.count(42)).to eq(1)

      wait_for_lease_end(lease)
      deliver(job) # stale claim taken over: the effect runs a second time
      deliver(job) # completed: turned away
      expect(Effects.count(42)).to eq(2)
      expect(record).to have_attributes(status: :completed, attempts: 2, takeovers: 1)
    end

    it "control: without the middleware every redelivery repeats the effect" do
      without_middleware!
      job = job_hash
      kill_worker_at(:after_effect, job)
      2.times { deliver(job) }
      expect(Effects.count(42)).to eq(3)
    end
  end

  describe "a job body that raises" do
    it "releases the claim and re-raises, so Sidekiq's retry runs it again once" do
      job = job_hash
      SpecHooks.on(:after_effect) { raise "card declined" }
      expect { deliver(job) }.to raise_error(RuntimeError, "card declined")
      expect(record).to have_attributes(status: :released, last_error: "RuntimeError: card declined")

      SpecHooks.reset!
      deliver(job) # the retry
      deliver(job)
      expect(Effects.count(42)).to eq(2) # the failed run's write, then the retry's
      expect(record).to have_attributes(status: :completed, attempts: 2, last_claim: :retry)
    end

    it "keeps the claim when the job ends with Sidekiq::Shutdown, even as a cause" do
      job = job_hash
      SpecHooks.on(:before_effect) do
        raise Sidekiq::Shutdown
      rescue Sidekiq::Shutdown
        raise "wrapped"
      end
      expect { deliver(job) }.to raise_error(RuntimeError, "wrapped")
      expect(record).to have_attributes(status: :claimed, attempts: 1)
    end
  end

  describe "two distinct operations" do
    it "both run: the gem does not skip real work" do
      ChargeOrderJob.perform_async(1, 100)
      ChargeOrderJob.perform_async(2, 100)
      ChargeOrderJob.drain
      expect([Effects.count(1), Effects.count(2)]).to eq([1, 1])
      expect([record("1"), record("2")].map(&:status)).to eq(%i[completed completed])
    end

    it "control: without the middleware both run as well" do
      without_middleware!
      ChargeOrderJob.perform_async(1, 100)
      ChargeOrderJob.perform_async(2, 100)
      ChargeOrderJob.drain
      expect(Effects.count).to eq(2)
    end
  end

  describe "jobs without idempotency_key" do
    it "pass through untouched: every delivery runs and nothing is recorded" do
      2.times { UnkeyedJob.perform_async(7) }
      UnkeyedJob.drain
      expect(Effects.count(7)).to eq(2)
      expect(IdempotentJob.record("UnkeyedJob", "7")).to be_nil
    end
  end

  describe "a shared idempotency_scope" do
    it "makes two job classes one operation when their keys agree" do
      ShipParcelJob.perform_async({ "order" => { "id" => 9 } }, "ups")
      ShipParcelV2Job.perform_async({ "order" => { "id" => 9 } }, "ups")
      Sidekiq::Job.drain_all
      expect(Effects.count("9/ups")).to eq(1)
      expect(IdempotentJob.record("shipping", '["9","ups"]')).to have_attributes(duplicates: 1)
    end
  end
end

RSpec.describe "Recording a completion" do
  it "recovers when the pool's connections are terminated while the body runs" do
    SpecHooks.on(:after_effect) do
      Effects.connection.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity " \
                              "WHERE application_name = 'idempotent_job' AND pid <> pg_backend_pid()")
    end
    ChargeOrderJob.perform_async(42, 1500)
    ChargeOrderJob.drain
    SpecHooks.reset!
    expect(IdempotentJob.record("ChargeOrderJob", "42")).to have_attributes(status: :completed)
    ChargeOrderJob.perform_async(42, 1500)
    ChargeOrderJob.drain
    expect(Effects.count(42)).to eq(1)
  end

  # Each attempt is bounded by the deadline (1 s here, 10 s by default), and the attempts
  # are 15.3 s of pauses apart: the whole is about 7 deadlines plus 15 s.
  it "is retried 7 times over about 15 s of pauses, then given up with an error log, the record left claimed, " \
     "the body not rerun" do
    log = StringIO.new
    SpecHooks.on(:after_effect) do
      SpecServices.configure_gem!(database_url: "postgres://postgres@127.0.0.1:1/gone", connect_timeout: 1,
                                  deadline: 1, logger: Logger.new(log))
    end
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    ChargeOrderJob.perform_async(42, 1500)
    expect { ChargeOrderJob.drain }.not_to raise_error
    SpecServices.configure_gem!
    expect(IdempotentJob.record("ChargeOrderJob", "42")).to have_attributes(status: :claimed)
    attempts = IdempotentJob::Native.completion_retry_delays.size + 1
    expect(log.string).to include("ran, but its completion could not be recorded after #{attempts} attempts")
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      .to be >= IdempotentJob::Native.completion_retry_delays.sum
    expect(Effects.count(42)).to eq(1)
  end
end

RSpec.describe "Completion after the body ran" do
  # direct_connection: the fault is a startup option, which a pooler such as PgBouncer
  # drops (bin/distributed-replay leaves it out of its PgBouncer run).
  it "is never handed to Sidekiq's retry on a database error: logged, the record left claimed",
     :direct_connection do
    log = StringIO.new
    SpecHooks.on(:after_effect) do
      SpecServices.configure_gem!(
        database_url: "#{SpecServices.database_url}?options=-cdefault_transaction_read_only%3Don",
        deadline: 1, logger: Logger.new(log) # each attempt retries the read-only server for a deadline
      )
    end
    ChargeOrderJob.perform_async(42, 1500)
    expect { ChargeOrderJob.drain }.not_to raise_error
    SpecServices.configure_gem!
    expect(log.string).to include("IdempotentJob::DatabaseError", "read-only transaction")
    expect(IdempotentJob.record("ChargeOrderJob", "42")).to have_attributes(status: :claimed)
    expect(Effects.count(42)).to eq(1)
  end
end

RSpec.describe "Re-enqueued payloads" do
  it "are not checked again by the client middleware: Sidekiq's pollers must never lose them" do
    bad = { "class" => "ChargeOrderJob", "args" => [nil, 1], "queue" => "default", "enqueued_at" => Time.now.to_f,
            "retry_count" => 0 }
    expect { Sidekiq::Client.push(bad) }.not_to raise_error
    expect(ChargeOrderJob.jobs.size).to eq(1)
    expect { ChargeOrderJob.perform_async(nil, 1) }.to raise_error(IdempotentJob::OperationKeyError)
  end
end
