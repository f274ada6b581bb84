# frozen_string_literal: true

require "spec_helper"
require "timeout"

# The native layer against a real PostgreSQL: errors, interrupts, the GVL, fork.
RSpec.describe "IdempotentJob's native layer" do
  describe "errors" do
    it "are all IdempotentJob::Error subclasses" do
      %w[ConfigurationError ConnectionError DatabaseError LostClaimError MigrationError
         OperationKeyError].each do |name|
        expect(IdempotentJob.const_get(name)).to be < IdempotentJob::Error
      end
    end

    it "reports an unreachable database as a retryable ConnectionError without the password" do
      SpecServices.configure_gem!(database_url: "postgres://app:pa55-secret@127.0.0.1:1/app", connect_timeout: 2,
                                  deadline: 2)
      expect { deliver_once("T", "1", lease: 5.0) }.to raise_error(IdempotentJob::ConnectionError) do |e|
        expect(e).to be_retryable
        expect(e.message).not_to include("pa55-secret")
      end
    end

    it "keeps PostgreSQL's SQLSTATE and says to migrate when the table is missing" do
      SpecServices.configure_gem!(database_url: "#{SpecServices.database_url}?options=-csearch_path%3Dnowhere")
      expect { deliver_once("T", "1", lease: 5.0) }.to raise_error(IdempotentJob::DatabaseError) do |e|
        expect(e.sqlstate).to eq("42P01")
        expect(e.message).to include("idempotent_job:migrate")
      end
    end

    it "rejects an unparsable URL at configure time without echoing the password" do
      expect do
        IdempotentJob.configure { |c| c.database_url = "postgres://u:pa55-secret@host:notaport/db" }
      end.to raise_error(IdempotentJob::ConfigurationError) { |e| expect(e.message).not_to include("pa55-secret") }
    end

    it "raises LostClaimError, naming job and key, when a taken-over claim is completed" do
      key = unique_key
      old = claim("T", key, "j1", 0.2)
      sleep 0.3
      new = claim("T", key, "j2", 5.0)
      expect(new).to include(decision: :claimed, kind: :takeover, attempt: 2)
      expect { complete("T", key, old[:token]) }.to raise_error(IdempotentJob::LostClaimError) do |e|
        expect([e.job_type, e.operation_key]).to eq(["T", key])
      end
      expect(complete("T", key, new[:token])).to be(true)
    end

    it "fails a delivery closed when the database is unreachable: ConnectionError, body not run" do
      SpecServices.configure_gem!(database_url: "postgres://postgres@127.0.0.1:1/none", connect_timeout: 1, deadline: 1)
      ChargeOrderJob.perform_async(5, 1)
      expect { ChargeOrderJob.drain }.to raise_error(IdempotentJob::ConnectionError)
      expect(Effects.count).to eq(0)
    end
  end

  describe "interrupts" do
    # no_gc_stress: left out of the GC.stress run (bin/test), where nothing is prompt.
    it "Timeout returns promptly from a claim blocked on a row lock; the next call is not delayed", :no_gc_stress do
      SpecServices.configure_gem!(pool_size: 1)
      key = unique_key
      stale_claim("T", key)
      with_row_locked("T", key) do
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        expect do
          Timeout.timeout(0.3) do
            deliver_once("T", key)
          end
        end.to raise_error(Timeout::Error)
        expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 1.0
        # The pool's one connection still runs the orphaned statement: it was detached.
        expect(deliver_once("T", unique_key)).to have_attributes(decision: :ran)
      end
    end

    # Under GC.stress (on process-wide while the two calls block: a full GC at every
    # allocation) this thread's polling of pg_stat_activity once took longer than the
    # calls' 10 s deadline, so the raise and the kill came after both had ended with
    # TimeoutError: the deadline is GCStress.bound(10) here, so they are still blocked.
    it "Thread#raise and Thread#kill reach a thread blocked in a claim" do
      SpecServices.configure_gem!(deadline: GCStress.bound(10))
      key = unique_key
      stale_claim("T", key)
      with_row_locked("T", key) do
        raised = Thread.new { deliver_once("T", key) }
        raised.report_on_exception = false
        killed = Thread.new { deliver_once("T", key) }
        # Both blocked in their claim (a fixed sleep was too short under GC.stress, where
        # the raise then came before the call blocked, e.g. inside the check of a job
        # option: see the example above).
        expect(await_gem_statements_on_lock(Effects.connection, 2)).to eq(2)
        raised.raise(ArgumentError, "stop")
        killed.kill
        # Within 2 s (60 under GC.stress, which the two blocked calls keep on: a full GC
        # at every allocation; bin/test's gc-stress step once took more than 2 s there).
        expect { raised.join(GCStress.bound(2)) }.to raise_error(ArgumentError, "stop")
        expect(killed.join(GCStress.bound(2))).to eq(killed)
      end
    end

    # Ruby delivers another thread's interrupt at a method call: here inside `inspect`,
    # which the native check of a job option calls (GC.stress once made that call slow
    # enough for a Thread#raise to land there, where the extension used to swallow it).
    it "Thread#raise delivered while a job option's value is checked reaches the caller" do
      caller_thread = Thread.current
      lease = Object.new
      lease.define_singleton_method(:inspect) do
        Thread.new { caller_thread.raise(ArgumentError, "stop") }.join
        "a lease"
      end
      expect { IdempotentJob.perform_once("T", unique_key, lease:) { nil } }.to raise_error(ArgumentError, "stop")
    end

    # The same at the call of the handler's `encode` (the body's value for store_result),
    # which used to become only a warning's words: the thread carried on.
    it "Thread#raise delivered while a body's value is encoded reaches the caller; the completion stands" do
      caller_thread = Thread.current
      allow(IdempotentJob::ResultJson).to receive(:encode).and_wrap_original do |encode, value|
        Thread.new { caller_thread.raise(ArgumentError, "stop") }.join
        encode.call(value)
      end
      key = unique_key
      expect { IdempotentJob.perform_once("T", key, store_result: true) { 42 } }.to raise_error(ArgumentError, "stop")
      expect(IdempotentJob.record("T", key)).to have_attributes(status: :completed)
    end

    it "cancels the interrupted statement: nothing runs on, and the record is untouched", :no_gc_stress do
      key = unique_key
      first = stale_claim("T", key)
      with_row_locked("T", key) do
        expect { Timeout.timeout(0.2) { deliver_once("T", key) } }.to raise_error(Timeout::Error)
        # An uncancelled statement would wait on the row lock held here.
        expect(gem_statements_running(Effects.connection)).to eq(0)
      end
      sleep 0.2
      expect(IdempotentJob.record("T", key)).to have_attributes(jid: "j", claim_token: first[:token], attempts: 1,
                                                                duplicates: 0)
    end

    # 100 calls beside a 1 ms waker: minutes under GC.stress.
    it "Thread#wakeup (no exception) resumes the same statement: nothing is sent twice", :no_gc_stress do
      main = Thread.current
      stop = false
      waker = Thread.new do
        until stop
          main.wakeup
          sleep 0.001
        end
      end
      outcomes = Array.new(100) do
        key = unique_key
        deliver_once("Wake", key).decision
      end
      stop = true
      waker.join
      expect(outcomes.tally).to eq(ran: 100) # a re-sent claim would find its own and be in_progress
    end
  end

  describe "the GVL" do
    it "is released while a call waits on the database, so other Ruby threads run" do
      key = unique_key
      stale_claim("T", key)
      ticks = 0
      with_row_locked("T", key) do
        waiter = Thread.new { Timeout.timeout(1) { deliver_once("T", key) } rescue nil } # rubocop:disable Style/RescueModifier
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.5
        ticks += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        waiter.join
      end
      expect(ticks).to be > 10_000
    end
  end

  describe "fork" do
    # 20 children each building a runtime under GC.stress outlast the 10 s read timeout.
    it "gives a forked child its own runtime and pool; the parent keeps working (20 times)", :no_gc_stress do
      20.times do |i|
        # The parent's claim is held across the fork; its completion comes after.
        parent = deliver_once("Fork", "parent-#{i}") do
          pid, reader = fork_worker do |pipe|
            deliver_once("Fork", "child-#{i}")
            pipe.puts(IdempotentJob.record("Fork", "child-#{i}").status)
          end
          expect(read_line(reader, timeout: 10)).to eq("completed")
          expect(wait_child(pid, timeout: 10)).to be_success
        end
        expect([parent.decision, IdempotentJob.record("Fork", "parent-#{i}").status]).to eq(%i[ran completed])
      end
    end

    # A transaction handle can outlive its store (a reconfiguration), holding the last
    # reference to that store's runtime. Garbage-collected in a forked child, dropping
    # it must not wait for the parent's runtime threads, which do not exist there (a
    # hang inside GC, with the GVL held, seen in the testing kit's forked workers).
    it "lets a forked child garbage-collect handles that outlived their store" do
      handles = Array.new(5) { IdempotentJob.store.transaction.tap(&:commit) }
      SpecServices.configure_gem!
      GC.start # the old store goes; the handles hold the last reference to its runtime
      pid, reader = fork_worker do |pipe|
        handles.clear
        4.times { GC.start(full_mark: true, immediate_sweep: true) }
        pipe.puts(deliver_once("Fork", "after-gc").decision)
      end
      expect(read_line(reader, timeout: 20)).to eq("ran")
      expect(wait_child(pid, timeout: 10)).to be_success
    end
  end

  describe "migrations" do
    it "are recorded and safe to run twice" do
      expect(IdempotentJob.migrate!).to eq([])
      expect(IdempotentJob.schema_sql).to include("CREATE TABLE idempotent_job_records")
    end
  end

  # Under IDEMPOTENT_JOB_GC_STRESS=1 (bin/test's GC.stress step) the one native call of a
  # delivery runs with a full GC at every allocation (seconds per delivery there): on the pool
  # (heartbeat, stored result, its replay), in the gem's transaction, a stale claim's
  # lookup.
  it "runs a delivery in one native call on every channel, its callbacks included" do
    key = "gc-#{SecureRandom.hex(4)}"
    options = { payload: [1, { "a" => "b" }], store_result: true, heartbeat: true }
    first = IdempotentJob.perform_once("NativeOneCall", key, **options) { |claim| { "k" => claim.operation_key } }
    again = IdempotentJob.perform_once("NativeOneCall", key, **options) { 1 }
    expect([first.decision, again.decision, again.replayed?,
            again.value]).to eq([:ran, :completed, true, { "k" => key }])
    tx = IdempotentJob.perform_once("NativeOneCallTx", key, transaction: true) { |_| :in_tx }
    expect([tx.decision, tx.value]).to eq(%i[ran in_tx])
    RecordRows.claim({ job_type: "NativeOneCallStale", operation_key: key, jid: "old", lease: 0.05 })
    sleep 0.1
    stale = IdempotentJob.perform_once("NativeOneCallStale", key, on_stale: :reclaim, lookup: ->(_) { :not_done }) { 2 }
    expect([stale.decision, stale.value, stale.claim.kind]).to eq([:ran, 2, :takeover])
  end

  it "gives the record one definition: IdempotentJob::Record's members are the native record's fields" do
    expect(IdempotentJob::Record.members).to eq(IdempotentJob::Native.record_fields.map(&:to_sym))
    IdempotentJob.perform_once("NativeColumnsSpec", "k-1", payload: [1, "a"]) { :done }
    record = IdempotentJob.record("NativeColumnsSpec", "k-1")
    expect(record.to_h.keys).to eq(IdempotentJob::Record.members)
    # A first claim stores no job (job class, queue, args: a takeover's, what a rerun re-sends).
    expect(record).to have_attributes(status: :completed, last_claim: :first, args: nil, job_class: nil,
                                      lease_expired: false)
    expect(record.args_digest).to eq(IdempotentJob::Native.args_digest([1, "a"]))
    expect(record.completed_at).to be_a(Time)
  end

  it "reads stored_job and job_classes from the core's record (its one rule of a stored job)" do
    key = "sj-#{SecureRandom.hex(4)}"
    RecordRows.claim({ job_type: "NativeStoredJob", operation_key: key, jid: "old", lease: 0.05,
                       job_class: "FirstJob" })
    first = IdempotentJob.record("NativeStoredJob", key)
    expect(first.to_h).to include(stored_job: false, job_class: nil, args: nil, job_classes: ["FirstJob"])
    expect(first.stored_job?).to be(false)
    sleep 0.1
    taken = IdempotentJob.perform_once("NativeStoredJob", key, on_stale: :reclaim, job_class: "TakerJob",
                                                               queue: "critical", payload: [1, { "a" => "b" }],
                                                               store_result: true) do |claim|
      { "kind" => claim.kind.to_s }
    end
    expect([taken.decision, taken.claim.kind]).to eq(%i[ran takeover])
    record = IdempotentJob.record("NativeStoredJob", key)
    expect(record.to_h).to include(stored_job: true, job_class: "TakerJob", queue: "critical",
                                   args: [1, { "a" => "b" }], job_classes: %w[FirstJob TakerJob],
                                   result: { "kind" => "takeover" }, result_state: :stored)
    expect(record.stored_job?).to be(true)
  end

  it "reads the operating calls' defaults from the core (held's limit, purge's batch, repeats' since and window)" do
    native = IdempotentJob::Native
    expect([native::DEFAULT_HELD_LIMIT, native::DEFAULT_PURGE_BATCH]).to eq([100, 1000])
    expect([native::DEFAULT_REPEATS_SINCE, native::DEFAULT_RESTART_WINDOW]).to eq([86_400, 120])
  end
end
