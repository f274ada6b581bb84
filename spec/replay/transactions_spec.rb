# frozen_string_literal: true

require "spec_helper"

# Effects in the same database: the claim, the job's writes and the completion commit
# in one transaction, so a crash or an exception at any point leaves everything or
# nothing. Both flavours (native handle, ActiveRecord models) run the same scenarios;
# each scenario also runs without the middleware, where the duplicates do happen.
RSpec.describe "Transactional jobs (effects in the same database)" do
  { "the native handle (idempotency_transaction: true)" => RecordPaymentJob,
    "ActiveRecord models (idempotency_transaction: :active_record)" => RecordPaymentArJob }.each do |flavour, job_class|
    describe flavour do
      let(:job_class) { job_class }
      let(:payment) { "pay-#{job_class.name}" }

      def payment_job(**extra)
        job_hash([payment, 500], klass: job_class, **extra)
      end

      def payment_record
        IdempotentJob.record(job_class.name, payment)
      end

      def race_threads(job)
        SpecHooks.on(:after_effect) { sleep 0.4 } # the first transaction stays open a while
        deliver_at_once(job, job)
      end

      it "three deliveries in a row: one row" do
        job = payment_job
        3.times { deliver(job) }
        expect(SpecPayment.rows(payment)).to eq(1)
        expect(payment_record).to have_attributes(status: :completed, attempts: 1, duplicates: 2)
      end

      it "control: without the middleware, three rows" do
        without_middleware!
        job = payment_job
        3.times { deliver(job) }
        expect(SpecPayment.rows(payment)).to eq(3)
      end

      it "two at once (threads): the second waits for the first to commit, then skips" do
        race_threads(payment_job)
        expect(SpecPayment.rows(payment)).to eq(1)
        expect(payment_record).to have_attributes(status: :completed, duplicates: 1)
        expect(job_class.jobs).to be_empty # nothing deferred: the wait replaced the lease
      end

      it "control: two at once (threads) without the middleware, two rows" do
        without_middleware!
        race_threads(payment_job)
        expect(SpecPayment.rows(payment)).to eq(2)
      end

      it "two at once (processes): one row" do
        expect(race_processes(payment_job, hold: 0.4) { "done" }).to eq(%w[done done])
        expect(SpecPayment.rows(payment)).to eq(1)
        expect(payment_record).to have_attributes(status: :completed, duplicates: 1)
      end

      it "control: two at once (processes) without the middleware, two rows" do
        without_middleware!
        expect(race_processes(payment_job, hold: 0.4) { "done" }).to eq(%w[done done])
        expect(SpecPayment.rows(payment)).to eq(2)
      end

      it "a worker SIGKILLed after its write, before commit: no row, no record; the redelivery commits once" do
        job = payment_job
        kill_worker_at(:after_effect, job)
        expect(SpecPayment.rows(payment)).to eq(0)
        expect(payment_record).to be_nil
        2.times { deliver(job) }
        expect(SpecPayment.rows(payment)).to eq(1)
        expect(payment_record).to have_attributes(status: :completed, attempts: 1)
      end

      it "control: SIGKILLed without the middleware, the write stays and the redelivery repeats it" do
        without_middleware!
        job = payment_job
        kill_worker_at(:after_effect, job)
        deliver(job)
        expect(SpecPayment.rows(payment)).to eq(2)
      end

      it "a body raising after its write: nothing committed; the retry commits once" do
        job = payment_job
        SpecHooks.on(:after_effect) { raise "ledger closed" }
        expect { deliver(job) }.to raise_error(RuntimeError, "ledger closed")
        expect(SpecPayment.rows(payment)).to eq(0)
        expect(payment_record).to be_nil
        SpecHooks.reset!
        2.times { deliver(job) }
        expect(SpecPayment.rows(payment)).to eq(1)
      end

      it "control: a body raising after its write without the middleware keeps the write; the retry adds one" do
        without_middleware!
        job = payment_job
        SpecHooks.on(:after_effect) { raise "ledger closed" }
        expect { deliver(job) }.to raise_error(RuntimeError)
        SpecHooks.reset!
        deliver(job)
        expect(SpecPayment.rows(payment)).to eq(2)
      end

      it "a duplicate waits at most its lock timeout, then fails with LockTimeoutError" do
        job = payment_job("idempotency_lock_timeout" => 0.3)
        inside = Queue.new
        SpecHooks.on(:after_effect) do
          inside << true
          sleep 1.5
        end
        holder = Thread.new do
          deliver(job)
        ensure
          ActiveRecord::Base.connection_handler.clear_active_connections!
        end
        inside.pop
        SpecHooks.reset!
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        expect { deliver(job) }.to raise_error(IdempotentJob::LockTimeoutError, /more than 0.3 s/) do |e|
          expect(e).to be_retryable
          expect(e.sqlstate).to eq("55P03") # the same attributes on both flavours
          expect(e.message).to start_with("RecordPayment")
        end
        expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 1.2
        holder.join
        deliver(job) # the retry, after the holder committed: skipped
        expect(SpecPayment.rows(payment)).to eq(1)
      ensure
        ActiveRecord::Base.connection_handler.clear_active_connections!
      end
    end
  end

  describe "the native handle" do
    it "binds parameters by the inferred type and returns typed rows" do
      rows = nil
      SpecHooks.on(:before_effect) do
        rows = IdempotentJob.current_transaction.query(
          "SELECT $1::int8 AS i, $2::float8 AS f, $3::text AS t, $4::bool AS b, $5::timestamptz AS at, " \
          "$6::jsonb AS j, $7::bytea AS bin, $8::date AS d, NULL::text AS n, $9::uuid AS u",
          [42, 1.5, "x", true, Time.at(1_700_000_000, 123_456, :usec), { "a" => [1, 2] }, "\x00\xFF".b,
           Date.new(2026, 11, 29), "8b0c0f4e-54a4-4f53-9fb4-2f5d3c2a1e10"]
        )
      end
      deliver(job_hash(["typed", 1], klass: RecordPaymentJob))
      expect(rows).to eq([{ "i" => 42, "f" => 1.5, "t" => "x", "b" => true,
                            "at" => Time.at(1_700_000_000, 123_456, :usec), "j" => { "a" => [1, 2] },
                            "bin" => "\x00\xFF".b, "d" => Date.new(2026, 11, 29), "n" => nil,
                            "u" => "8b0c0f4e-54a4-4f53-9fb4-2f5d3c2a1e10" }])
    end

    it "never corrupts a value silently: big JSON numbers kept, float4 overflow and Time-to-date refused" do
      results = {}
      SpecHooks.on(:before_effect) do
        tx = IdempotentJob.current_transaction
        results[:json] = tx.query("SELECT $1::jsonb AS j", [{ "id" => 12_345_678_901_234_567_890_123 }]).first["j"]
        %i[float4 date].each do |kind|
          sql = kind == :float4 ? "SELECT $1::float4" : "SELECT $1::date"
          value = kind == :float4 ? 1e300 : Time.now
          tx.query(sql, [value])
        rescue IdempotentJob::ConfigurationError => e
          results[kind] = e.message
        end
      end
      deliver(job_hash(["exact", 1], klass: RecordPaymentJob))
      expect(results[:json]).to eq({ "id" => 12_345_678_901_234_567_890_123 })
      expect(results[:float4]).to include("out of range for type float4")
      expect(results[:date]).to include("bind a Date")
    end

    it "names the placeholder and suggests a cast when a value cannot be bound" do
      SpecHooks.on(:before_effect) do
        IdempotentJob.current_transaction.query("SELECT $1::int4 AS n", ["not a number"])
      end
      expect { deliver(job_hash(["bad-bind", 1], klass: RecordPaymentJob)) }
        .to raise_error(IdempotentJob::ConfigurationError, /cannot bind a string to a parameter of type int4/)
      expect(IdempotentJob.record("RecordPaymentJob", "bad-bind")).to be_nil
    end
  end
end
