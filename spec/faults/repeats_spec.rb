# frozen_string_literal: true

require "spec_helper"

# Issue 25's repeat bookkeeping and pool findings, each against the real PostgreSQL:
# concurrent duplicates from several processes, a read-only server, a burst of
# configure calls.
RSpec.describe "Repeat bookkeeping and replaced pools", :faults do
  def sql(query, *params)
    conn = PG.connect(SpecServices.database_url)
    conn.exec_params(query, params).to_a
  ensure
    conn&.close
  end

  def duplicates_of(job_type)
    sql("SELECT operation_key, duplicates FROM idempotent_job_records WHERE job_type = $1", job_type)
      .to_h { |r| [r["operation_key"], Integer(r["duplicates"])] }
  end

  def unique(name)
    "#{name}-#{SecureRandom.hex(4)}"
  end

  describe "duplicates answered by several processes at once" do
    let(:processes) { 4 }
    let(:threads) { 8 }
    let(:per_thread) { 200 }

    # Half of each thread's duplicates are of one operation every thread shares, half
    # of 200 operations in the thread's own random order: concurrent batches meet the
    # same rows in different orders (which made them deadlock, 2 to 7 times a run, and
    # the losing batches were dropped: 900 to 4,200 of the 6,400 counts).
    it "counts every duplicate, and no batch deadlocks or fails" do
      job_type = unique("Storm")
      keys = Array.new(200) { |i| "op-#{i}" }
      ["shared", *keys].each { |k| IdempotentJob.perform_once(job_type, k) { nil } }
      deadlocks = lambda do
        Integer(sql("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").first["deadlocks"])
      end
      before = deadlocks.call
      workers = Array.new(processes) do
        fork_worker do |pipe|
          IdempotentJob.reset! # this process's own pool, without writing the parent's
          SpecServices.configure_gem!(pool_size: threads + 2)
          counts = Hash.new(0)
          lock = Mutex.new
          Array.new(threads) do
            Thread.new do
              random = Random.new
              per_thread.times do |i|
                key = i.even? ? "shared" : keys[random.rand(keys.size)]
                outcome = IdempotentJob.perform_once(job_type, key) { raise "a duplicate ran" }
                raise "#{key}: #{outcome.decision}" unless outcome.decision == :completed

                lock.synchronize { counts[key] += 1 }
              end
            end
          end.each(&:join)
          IdempotentJob.settle_repeats # raised 40P01 before the fix, in some processes
          pipe.puts(JSON.generate(counts))
        end
      end
      answered = Hash.new(0)
      workers.each do |pid, reader|
        line = read_line(reader, timeout: 180)
        raise line if line.start_with?("error")

        JSON.parse(line).each { |k, n| answered[k] += n }
        expect(wait_child(pid, timeout: 60)).to be_success
      end
      expect(answered.values.sum).to eq(processes * threads * per_thread)
      counted = duplicates_of(job_type)
      expect(counted.slice(*answered.keys)).to eq(answered)
      sleep 1 # the workers' backends report their statistics as they end
      expect(deadlocks.call - before).to eq(0)
    end
  end

  describe "a duplicate of a completed operation while the server is read-only" do
    def read_only!(on)
      sql("ALTER SYSTEM #{on ? "SET default_transaction_read_only = on" : "RESET default_transaction_read_only"}")
      sql("SELECT pg_reload_conf()")
      # Every session, the gem's pooled ones included, applies the reload before its
      # next statement; a new one shows that the server has read it.
      Timeout.timeout(10) do
        sleep 0.05 until sql("SHOW default_transaction_read_only").first.values == [on ? "on" : "off"]
      end
    end

    after { read_only!(false) }

    it "is answered from a read (its count is written once the server takes writes); a new operation is not" do
      SpecServices.configure_gem!(deadline: 1)
      job_type = unique("ReadOnly")
      IdempotentJob.perform_once(job_type, "done") { nil }
      read_only!(true)

      outcome = IdempotentJob.perform_once(job_type, "done") { raise "a duplicate ran" }
      expect(outcome.decision).to eq(:completed)
      expect { IdempotentJob.perform_once(job_type, "new") { raise "ran on a read-only server" } }
        .to raise_error(IdempotentJob::DatabaseError) { |e| expect(e.sqlstate).to eq("25006") }
      expect(IdempotentJob.record(job_type, "done")).to have_attributes(status: :completed, duplicates: 0)

      read_only!(false)
      IdempotentJob.settle_repeats
      expect(IdempotentJob.record(job_type, "done")).to have_attributes(status: :completed, duplicates: 1)
      expect(IdempotentJob.record(job_type, "new")).to be_nil
    end
  end

  describe "a batch PostgreSQL refuses for good" do
    let(:schema) { "dropped_#{SecureRandom.hex(4)}" }

    after do
      SpecServices.configure_gem!
      sql("DROP SCHEMA IF EXISTS #{schema} CASCADE")
    end

    it "is dropped, counted and logged once, not written again" do
      sql("CREATE SCHEMA #{schema}")
      log = StringIO.new
      SpecServices.configure_gem!(schema:, logger: Logger.new(log))
      IdempotentJob.migrate!
      IdempotentJob.perform_once("Refused", "1") { nil }
      # Every update of the record fails (P0001, not transient); a duplicate's look reads.
      sql("CREATE FUNCTION #{schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE 'refused'; END $$")
      sql("CREATE TRIGGER refuse BEFORE UPDATE ON #{schema}.idempotent_job_records " \
          "FOR EACH ROW EXECUTE FUNCTION #{schema}.refuse()")
      3.times { expect(IdempotentJob.perform_once("Refused", "1") { raise "ran" }.decision).to eq(:completed) }
      begin
        IdempotentJob.settle_repeats # raises P0001 when the last batch was still queued
      rescue IdempotentJob::DatabaseError => e
        expect(e.sqlstate).to eq("P0001")
      end
      expect(log.string).to include("idempotent_job: 3 repeat counts dropped instead of written")
      IdempotentJob.settle_repeats # nothing queued, nothing more dropped: logged once
      expect(log.string.scan("repeat counts dropped").size).to eq(1)
      expect(IdempotentJob.record("Refused", "1").duplicates).to eq(0)
    end
  end

  describe "a burst of configure calls" do
    def backends(prefix)
      sql("SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1", "#{prefix}%")
        .map { |r| r["application_name"] }
    end

    # Without a garbage collection: the replaced stores are garbage, but their pools
    # must not wait for Ruby's GC to let their connections go.
    around do |example|
      GC.disable
      example.run
    ensure
      GC.enable
    end

    it "leaves no connection of a replaced pool once its calls are done" do
      prefix = unique("burst")
      names = Array.new(12) { |i| "#{prefix}-#{i}" }
      names.each do |name|
        SpecServices.configure_gem!(application_name: name, pool_size: 3)
        # A few calls at once, so each pool opens several connections.
        Array.new(3) { |t| Thread.new { IdempotentJob.perform_once(prefix, "#{name}-#{t}") { nil } } }.each(&:join)
      end
      expect(backends(prefix)).to include(names.last)
      # A closed connection's backend ends a moment after its socket closes.
      Timeout.timeout(20) { sleep 0.05 until (backends(prefix) - [names.last]).empty? }
      expect(backends(prefix) - [names.last]).to be_empty
    end

    it "lets a call in flight on the replaced pool finish first" do
      name = unique("in-flight")
      SpecServices.configure_gem!(application_name: name)
      started = Queue.new
      call = Thread.new do
        IdempotentJob.perform_once(name, "long") do
          started << true
          sleep 0.5 # the body runs while configure replaces the pool under it
          :done
        end
      end
      started.pop
      SpecServices.configure_gem!
      expect(call.value).to have_attributes(decision: :ran, value: :done)
      expect(IdempotentJob.record(name, "long")).to have_attributes(status: :completed)
      Timeout.timeout(20) { sleep 0.05 until backends(name).empty? }
    end
  end
end
