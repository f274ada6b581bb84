# frozen_string_literal: true

require "spec_helper"
require_relative "../support/web_records"
require_relative "support/fault_proxy"
require_relative "support/probe_jobs"

# What a fault probe found, each turned into a check: arguments jsonb cannot hold, a
# table that drifted from the migrations, a read-only failover, a dead network while
# a job runs.
RSpec.describe "Fault probe findings", :faults do
  include ReplayHelpers

  describe "a NUL character in the arguments" do
    it "runs the job once and keeps the arguments, NULs included" do
      args = [7, "a\u0000b", { "nested" => ["\u0000"] }]
      job = job_hash(args.first(2), klass: NoteJob).merge("args" => args)
      # A dead worker's stale claim first: the delivery that takes it over stores its job
      # (a first claim stores none), NULs and all.
      web_stale("NoteJob", "7")
      2.times { deliver(job, klass: NoteJob) }
      expect(Effects.count("7:1")).to eq(1)
      record = IdempotentJob.record("NoteJob", 7)
      expect(record.status).to eq(:completed)
      expect(record.args).to eq(args)
      expect(record.duplicates).to eq(1)
    end
  end

  describe "a table that drifted from the migrations" do
    let(:schema) { "drift_#{rand(1 << 20)}" }

    # After the suite's own `before` (which configures the gem for the public schema),
    # so every example runs against the schema it drifts.
    before do
      PG.connect(SpecServices.database_url).tap { |c| c.exec("CREATE SCHEMA #{schema}") }.close
      SpecServices.configure_gem!(schema:)
      IdempotentJob.migrate!
    end

    # Nothing stays configured at the schema dropped here.
    after do
      SpecServices.configure_gem!
      PG.connect(SpecServices.database_url).tap do |c|
        c.exec("SET client_min_messages = warning")
        c.exec("DROP SCHEMA #{schema} CASCADE")
      end.close
    end

    def drop(*columns)
      PG.connect(SpecServices.database_url).tap do |c|
        columns.each { |col| c.exec("ALTER TABLE #{schema}.idempotent_job_records DROP COLUMN #{col}") }
      end.close
      SpecServices.configure_gem!(schema:) # a new process: its first claim checks the table
    end

    it "refuses to run bodies when completions cannot be recorded, naming the missing columns" do
      drop("completed_at", "heartbeat_at")
      job = job_hash([42, 1500])
      expect { deliver(job) }.to raise_error(IdempotentJob::DatabaseError) { |e|
        expect(e.message).to include("ChargeOrderJob", "missing columns completed_at, heartbeat_at",
                                     "rake idempotent_job:migrate")
        expect(e.sqlstate).to eq("42703")
      }
      expect(Effects.count).to eq(0)
    end

    it "has migrate! say the table drifted instead of reporting nothing to apply" do
      drop("heartbeat_at")
      expect { IdempotentJob.migrate! }.to raise_error(IdempotentJob::MigrationError, /drifted.*heartbeat_at/)
    end

    it "checks once, then claims without looking again" do
      deliver(job_hash([42, 1500]))
      expect(Effects.count(42)).to eq(1)
      # Dropped after this process checked: only a new process (or pool) notices.
      PG.connect(SpecServices.database_url).tap do |c|
        c.exec("ALTER TABLE #{schema}.idempotent_job_records DROP COLUMN resolution")
      end.close
      deliver(job_hash([43, 1500]))
      expect(Effects.count(43)).to eq(1)
      in_schema = PG.connect(SpecServices.database_url).then do |c|
        c.exec("SELECT count(*) FROM #{schema}.idempotent_job_records WHERE status = 'completed'").getvalue(0, 0)
      ensure
        c&.close
      end
      expect(in_schema).to eq("2") # both went to the drifted table
    end
  end

  describe "a read-only server (a failover in progress)" do
    it "raises a retryable DatabaseError with SQLSTATE 25006 and runs nothing" do
      url = "#{SpecServices.database_url}?options=-c%20default_transaction_read_only%3Don"
      SpecServices.configure_gem!(database_url: url, deadline: 2) # retried on fresh connections until then
      expect { deliver(job_hash([42, 1500])) }.to raise_error(IdempotentJob::DatabaseError) { |e|
        expect(e.sqlstate).to eq("25006")
        expect(e.retryable?).to be(true)
        expect(e.message).to include("read-only")
      }
      expect(Effects.count).to eq(0)
    end

    it "keeps other database errors not retryable" do
      expect { RecordRows.claim({ job_type: "J", operation_key: "k", lease: 1.0, args_json: "[1" }) }
        .to raise_error(IdempotentJob::DatabaseError) { |e| expect(e.retryable?).to be(false) }
    end
  end

  describe "a pool held by claims waiting on a row lock" do
    it "still records the completion of a body that ran, and bounds the waiting claims by the deadline" do
      SpecServices.configure_gem!(pool_size: 2, deadline: 3, checkout_timeout: 2)
      # Operation 7 holds a stale claim (a read cannot decide it: the claim statement
      # must, and it waits on the row locked below).
      claim("ChargeOrderJob", "7", "gone", 0.1)
      sleep 0.2
      waiting = []
      waited = []
      with_row_locked("ChargeOrderJob", "7") do
        SpecHooks.on(:after_effect) do |order_id|
          next unless order_id == 8

          # While operation 8's body runs, two deliveries of 7 take both pooled connections.
          2.times do
            waiting << Thread.new do
              started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
              deliver(job_hash([7, 1]))
            rescue IdempotentJob::Error => e
              waited << [e.class, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
            end
          end
          sleep 0.5
        end
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        deliver(job_hash([8, 1]))
        completed_in = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started - 0.5
        puts "\n  pool starvation: completion recorded #{completed_in.round(3)} s after the body " \
             "(pool_size 2, both connections held by claims on a locked row)"
        expect(completed_in).to be < 1
        waiting.each(&:join)
      end
      expect(IdempotentJob.record("ChargeOrderJob", 8).status).to eq(:completed)
      puts "  claims waiting on the locked row ended after #{waited.map { |_, t| t.round(2) }} s (deadline 3)"
      expect(waited.map(&:first)).to eq([IdempotentJob::TimeoutError] * 2)
      expect(waited.map(&:last)).to all(be < 4.5)
    end
  end

  describe "a dead network while a job runs" do
    it "reports the failing heartbeat while the body runs and tells the job its claim is in doubt" do
      proxy = FaultProxy.new(URI(SpecServices.database_url).port)
      log = StringIO.new
      url = SpecServices.database_url.sub(/:\d+/, ":#{proxy.port}")
      SpecServices.configure_gem!(database_url: url, logger: Logger.new(log))
      events = []
      handle = IdempotentJob.subscribe(:heartbeat_failed) { |_, payload| events << payload }
      seen = nil
      SpecHooks.on(:cut) { proxy.blackhole! }
      SpecHooks.on(:seen) { |before, after| seen = [before, after, events.size] }
      SpecHooks.on(:heal) { proxy.restore! }
      deliver(job_hash([5], klass: DoubtfulJob))
      expect(seen.first(2)).to eq([false, true])
      expect(seen.last).to be >= 1 # the event came while the body still ran
      expect(events.first).to include(job_type: "DoubtfulJob", operation_key: "5", in_doubt: true)
      expect(events.first[:failures]).to be >= 1
      expect(log.string).to include("could not be renewed", "in doubt")
      expect(IdempotentJob.record("DoubtfulJob", 5).status).to eq(:completed)
    ensure
      IdempotentJob.unsubscribe(handle) if handle
      proxy&.stop
    end

    it "answers in_doubt? false while the heartbeat renews" do
      seen = nil
      SpecHooks.on(:seen) { |before, after| seen = [before, after] }
      deliver(job_hash([6], klass: DoubtfulJob))
      expect(seen).to eq([false, false])
    end
  end
end
