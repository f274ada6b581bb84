# frozen_string_literal: true

require "spec_helper"

# The one native call of a delivery (`Native::Protocol#perform`) attacked from Ruby: jumps
# out of the body (throw, break, Timeout), interrupts reaching a thread while the body runs
# or while a statement is in flight, exceptions that misbehave, nesting, threads, fibers,
# fork and GC. What must hold each time: no crash or hang (bounded joins), the record is
# never left claimed unless the policy says so (a released claim is retried at once; only
# a dying thread keeps it for its lease), the body never runs twice, the error is the
# user's own (the same object) or the library's, and the pool still serves a delivery.
RSpec.describe "One native call per delivery, attacked from Ruby", :faults do
  let(:runs) { Queue.new }

  def status(job_type, key)
    IdempotentJob.record(job_type, key)&.status
  end

  # A following delivery on the same pool still runs and completes.
  def pool_still_serves
    expect(IdempotentJob.perform_once("Attack::After", unique_key) { :ok }.decision).to eq(:ran)
  end

  # A thread holding a live claim on the operation until `release` is called; `release`
  # returns the holder's outcome (the body ran and completed).
  # @return [Proc] release
  def live_holder(job_type, key)
    inside = Queue.new
    finish = Queue.new
    holder = Thread.new do
      IdempotentJob.perform_once(job_type, key) do
        inside << true
        finish.pop
      end
    end
    inside.pop
    lambda do
      finish << :done
      holder.join(10).value
    end
  end

  # A retry right after runs the body (the claim was released, not kept for its lease).
  def retried_at_once(job_type, key, **options)
    outcome = IdempotentJob.perform_once(job_type, key, **options) { runs << :retry }
    expect(outcome.decision).to eq(:ran)
    expect(status(job_type, key)).to eq(:completed)
  end

  # A claim kept by an interrupted body (Interrupt keeps it) whose 0.3 s lease has run
  # out: the next delivery of the operation asks its lookup.
  def stale_claim(job_type, key)
    expect { IdempotentJob.perform_once(job_type, key, lease: 0.3) { raise Interrupt } }.to raise_error(Interrupt)
    sleep 0.4
  end

  describe "leaving the body without an exception" do
    it "Timeout.timeout around perform_once: Timeout::Error, the claim released, a retry runs at once" do
      key = unique_key
      expect { Timeout.timeout(0.2) { IdempotentJob.perform_once("Attack::Timeout", key) { sleep 30 } } }
        .to raise_error(Timeout::Error)
      expect(status("Attack::Timeout", key)).to eq(:released)
      retried_at_once("Attack::Timeout", key)
      pool_still_serves
    end

    it "throw out of the body: the throw arrives, the claim is released, not completed" do
      key = unique_key
      caught = catch(:out) { IdempotentJob.perform_once("Attack::Throw", key) { throw :out, :thrown } }
      expect(caught).to eq(:thrown)
      expect(status("Attack::Throw", key)).to eq(:released)
      retried_at_once("Attack::Throw", key)
    end

    it "break out of the body: the break arrives, the claim is released" do
      key = unique_key
      broke = IdempotentJob.perform_once("Attack::Break", key) { break :broken }
      expect(broke).to eq(:broken)
      expect(status("Attack::Break", key)).to eq(:released)
      retried_at_once("Attack::Break", key)
    end

    it "throw out of a lookup: the throw arrives (no LookupError), not run, the stale claim taken over later" do
      key = unique_key
      stale_claim("Attack::LookupThrow", key)
      thrown = lambda { |_key|
        throw :out, :thrown
      }
      caught = catch(:out) do
        IdempotentJob.perform_once("Attack::LookupThrow", key, lookup: thrown) { runs << :thrown }
      end
      expect(caught).to eq(:thrown)
      expect(runs).to be_empty
      expect(IdempotentJob.perform_once("Attack::LookupThrow", key) { runs << :after }.decision).to eq(:ran)
      expect(runs.size).to eq(1)
    end

    it "a lookup raising an error whose #message raises: LookupError naming that class, not run, asked again" do
      key = unique_key
      stale_claim("Attack::LookupBadMessage", key)
      bad = stub_const("BadMessageError", Class.new(StandardError) do
        def message = raise(ArgumentError, "no message for you")
      end)
      expect do
        IdempotentJob.perform_once("Attack::LookupBadMessage", key, lookup: ->(_k) { raise bad }) { runs << :ran }
      end.to raise_error(IdempotentJob::LookupError, /raised BadMessageError: \(its #message raised ArgumentError\)/)
      expect(runs).to be_empty
    end

    it "a lookup raising an error of an anonymous class: LookupError says so, not an empty name" do
      key = unique_key
      stale_claim("Attack::LookupAnonymous", key)
      anonymous = Class.new(StandardError)
      expect do
        IdempotentJob.perform_once("Attack::LookupAnonymous", key, lookup: ->(_k) { raise anonymous, "gone" }) do
          runs << :ran
        end
      end.to raise_error(IdempotentJob::LookupError, /raised an anonymous exception class: gone/)
      expect(runs).to be_empty
    end

    it "throw out of a transaction: true body: rolled back, nothing recorded, the pool serves" do
      key = unique_key
      catch(:out) { IdempotentJob.perform_once("Attack::TxThrow", key, transaction: true) { throw :out } }
      expect(status("Attack::TxThrow", key)).to be_nil
      retried_at_once("Attack::TxThrow", key, transaction: true)
    end
  end

  describe "exceptions that misbehave" do
    let(:bad_message) do
      Class.new(StandardError) do
        def message = raise(ArgumentError, "no message for you")
      end
    end

    it "an exception whose #message raises: the same exception re-raised, the claim released" do
      key = unique_key
      raised = bad_message.new
      expect { IdempotentJob.perform_once("Attack::BadMessage", key) { raise raised } }
        .to(raise_error { |e| expect(e).to equal(raised) })
      expect(status("Attack::BadMessage", key)).to eq(:released)
      retried_at_once("Attack::BadMessage", key)
    end

    it "an exception whose message is not UTF-8, or holds a NUL: the same exception re-raised, released" do
      ["bytes \xFF\xFE".b, "a NUL \0 inside", "\xFF".dup.force_encoding(Encoding::UTF_8)].each_with_index do |text, i|
        key = "#{unique_key}-#{i}"
        raised = RuntimeError.new(text)
        expect { IdempotentJob.perform_once("Attack::Words", key) { raise raised } }
          .to(raise_error { |e| expect(e).to equal(raised) })
        record = IdempotentJob.record("Attack::Words", key)
        expect(record.status).to eq(:released)
        expect(record.last_error).to start_with("RuntimeError: ")
        retried_at_once("Attack::Words", key)
      end
    end

    # The door's crash rule is user code too (a door of one's own, a subclass): when it
    # raises, the body's exception once gave way to the door's (released), lost.
    it "a door whose crash? raises: the body's exception comes out; the base rule decides the claim" do
      door = Class.new(IdempotentJob::Door) { def crash?(_error) = raise(NoMethodError, "a bug in the door") }.new
      options = IdempotentJob::JobOptions.cached("Attack::CrashRule", {})
      run = lambda do |key, raised|
        delivery = IdempotentJob::Delivery.new(job_type: "Attack::CrashRule", operation_key: key, id: "d-#{key}")
        IdempotentJob::Protocol.new(options, door:).run(delivery) { raise raised }
      end
      key = unique_key
      raised = RuntimeError.new("the body's own")
      expect { run.call(key, raised) }.to(raise_error { |e| expect(e).to equal(raised) })
      record = IdempotentJob.record("Attack::CrashRule", key)
      expect(record.status).to eq(:released)
      expect(record.last_error).to start_with("RuntimeError: the body's own").and include("crash? raised NoMethodError")
      retried_at_once("Attack::CrashRule", key)
      signal = Interrupt.new # the base rule: a signal keeps the claim for its lease
      expect { run.call("#{key}-signal", signal) }.to(raise_error { |e| expect(e).to equal(signal) })
      expect(status("Attack::CrashRule", "#{key}-signal")).to eq(:claimed)
    end

    it "an exception class whose name is not UTF-8: the same exception re-raised, released" do
      key = unique_key
      odd = Class.new(StandardError) { def self.name = "Odd\xFFName".b }
      raised = odd.new("words")
      expect { IdempotentJob.perform_once("Attack::OddClass", key) { raise raised } }
        .to(raise_error { |e| expect(e).to equal(raised) })
      expect(IdempotentJob.record("Attack::OddClass", key).last_error).to end_with(": words")
      retried_at_once("Attack::OddClass", key)
    end

    it "an exception whose #cause raises or answers no exception: the same exception re-raised, released" do
      [Class.new(StandardError) { def cause = raise(ArgumentError, "no cause for you") },
       Class.new(StandardError) { def cause = 42 }].each_with_index do |odd, i|
        key = "#{unique_key}-#{i}"
        raised = odd.new("mine")
        expect { IdempotentJob.perform_once("Attack::BadCause", key) { raise raised } }
          .to(raise_error { |e| expect(e).to equal(raised) })
        expect(status("Attack::BadCause", key)).to eq(:released)
        retried_at_once("Attack::BadCause", key)
      end
    end

    it "an exception class whose name raises, with a delivered subscriber: the same exception, released" do
      key = unique_key
      seen = []
      handle = IdempotentJob::Events.subscribe(:delivered) { |_, payload| seen << payload[:error] }
      raised = Class.new(StandardError) { def self.name = raise(ArgumentError, "no name for you") }.new("mine")
      expect { IdempotentJob.perform_once("Attack::BadName", key) { raise raised } }
        .to(raise_error { |e| expect(e).to equal(raised) })
      expect(status("Attack::BadName", key)).to eq(:released)
      expect(seen).to eq([nil]) # an anonymous class: no name
    ensure
      IdempotentJob::Events.unsubscribe(handle) if handle
    end

    it "a cause chain 10,000 deep, and one the `cause` method makes up anew each time: the same exception" do
      deep = (1..10_000).reduce(nil) do |cause, i|
        raise "level #{i}", cause:
      rescue StandardError => e
        e
      end
      endless = Class.new(StandardError) { def cause = self.class.new("another") }.new("mine")
      [deep, endless].each_with_index do |raised, i|
        key = "#{unique_key}-#{i}"
        expect { IdempotentJob.perform_once("Attack::DeepCause", key) { raise raised } }
          .to(raise_error { |e| expect(e).to equal(raised) })
        expect(status("Attack::DeepCause", key)).to eq(:released)
      end
    end

    it "exit (SystemExit) and a bare Exception: re-raised unchanged, released (not a crash by the plain door)" do
      [-> { exit 3 }, -> { raise Exception, "bare" }].each_with_index do |body, i| # rubocop:disable Lint/RaiseException
        key = "#{unique_key}-#{i}"
        error = begin
          IdempotentJob.perform_once("Attack::NotStandard", key) { body.call }
        rescue Exception => e # rubocop:disable Lint/RescueException
          e
        end
        expect(error).to be_a(i.zero? ? SystemExit : Exception)
        expect(status("Attack::NotStandard", key)).to eq(:released)
      end
      pool_still_serves
    end

    it "an Interrupt (SignalException) keeps the claim for its lease: the worker is going away" do
      key = unique_key
      expect { IdempotentJob.perform_once("Attack::Signal", key) { raise Interrupt } }.to raise_error(Interrupt)
      expect(status("Attack::Signal", key)).to eq(:claimed)
      expect(IdempotentJob.perform_once("Attack::Signal", key) { runs << :again }.decision).to eq(:in_progress)
      expect(runs).to be_empty
    end
  end

  describe "values past what a clock or a column holds" do
    it "wait: 1e300 against a live claim: ConfigurationError naming the job (no fatal); the holder completes" do
      key = unique_key
      release = live_holder("Attack::HugeWait", key)
      expect { IdempotentJob.perform_once("Attack::HugeWait", key, wait: 1e300) { runs << :waiter } }
        .to raise_error(IdempotentJob::ConfigurationError, /\AAttack::HugeWait: wait must be/)
      expect(release.call.decision).to eq(:ran)
      expect(runs).to be_empty
      pool_still_serves
    end

    it "a delivery id, job class or queue that is not UTF-8: ConfigurationError naming the job and the field" do
      key = unique_key
      [[{ id: "\xFF".b }, "id"], [{ job_class: "X\xFF".b }, "job class"], [{ queue: "\xFE".b }, "queue"]]
        .each do |options, field|
          expect { IdempotentJob.perform_once("Attack::Bytes", key, **options) { runs << field } }
            .to raise_error(IdempotentJob::ConfigurationError,
                            /\AAttack::Bytes: the delivery's #{field} is not valid UTF-8/)
        end
      expect(runs).to be_empty
      expect(status("Attack::Bytes", key)).to be_nil
      pool_still_serves
    end

    it "a delivery id, job class or job type holding a NUL: ConfigurationError naming the field, nothing recorded" do
      key = unique_key
      [["Attack::NulId", { id: "a\0b" }, "id"], ["Attack::NulClass", { job_class: "X\0" }, "job class"],
       ["Attack::Nul\0Type", {}, "job type"]].each do |type, options, field|
        expect { IdempotentJob.perform_once(type, key, **options) { runs << type } }
          .to raise_error(IdempotentJob::ConfigurationError, /: the delivery's #{field} holds a NUL character/)
      end
      expect(runs).to be_empty
      expect(status("Attack::NulId", key)).to be_nil
      pool_still_serves
    end
  end

  describe "interrupts from other threads" do
    it "Thread#kill while the body runs: the claim is kept (a crash), not completed; the pool serves" do
      key = unique_key
      inside = Queue.new
      worker = Thread.new do
        IdempotentJob.perform_once("Attack::Kill", key) do
          inside << true
          sleep 30
        end
      end
      inside.pop
      worker.kill
      expect(worker.join(10)).to eq(worker)
      expect(status("Attack::Kill", key)).to eq(:claimed)
      pool_still_serves
    end

    it "Thread#raise while the body runs: that exception re-raised, the claim released" do
      key = unique_key
      inside = Queue.new
      worker = Thread.new do
        IdempotentJob.perform_once("Attack::Raise", key) do
          inside << true
          sleep 30
        end
      end
      worker.report_on_exception = false
      inside.pop
      worker.raise(ArgumentError, "from outside")
      expect { worker.join(10) }.to raise_error(ArgumentError, "from outside")
      expect(status("Attack::Raise", key)).to eq(:released)
      retried_at_once("Attack::Raise", key)
    end

    it "Thread#raise and Thread#kill reach threads waiting (wait:) for a live claim; the holder completes" do
      key = unique_key
      release = live_holder("Attack::Wait", key)
      waiting = Queue.new
      IdempotentJob.configuration.logger = Logger.new(StringIO.new).tap do |log|
        log.formatter = proc { |_, _, _, line|
          waiting << true if line.include?("waiting up to")
          ""
        }
      end
      raised = Thread.new { IdempotentJob.perform_once("Attack::Wait", key, wait: 60) { runs << :raised } }
      raised.report_on_exception = false
      killed = Thread.new { IdempotentJob.perform_once("Attack::Wait", key, wait: 60) { runs << :killed } }
      2.times { waiting.pop }
      raised.raise(ArgumentError, "stop waiting")
      killed.kill
      expect { raised.join(10) }.to raise_error(ArgumentError, "stop waiting")
      expect(killed.join(10)).to eq(killed)
      expect(release.call.decision).to eq(:ran)
      expect(runs).to be_empty
      expect(status("Attack::Wait", key)).to eq(:completed)
      pool_still_serves
    end
  end

  describe "interrupts while the gem logs" do
    # A log device that blocks on the "waiting up to" line until the test lets it go.
    let(:device) do
      Class.new do
        attr_reader :writing, :gate

        def initialize
          @writing = Queue.new
          @gate = Queue.new
        end

        def write(line)
          return unless line.include?("waiting up to")

          @writing << true
          @gate.pop
        end

        def close; end
      end.new
    end

    it "Thread#raise landing in a ::Logger write before a wait: raised, not swallowed by Logger (no 60 s wait)" do
      key = unique_key
      release = live_holder("Attack::LogRaise", key)
      IdempotentJob.configuration.logger = Logger.new(device)
      waiter = Thread.new { IdempotentJob.perform_once("Attack::LogRaise", key, wait: 60) { runs << :waiter } }
      waiter.report_on_exception = false
      device.writing.pop
      waiter.raise(ArgumentError, "while logging")
      device.gate << true
      expect { waiter.join(10) }.to raise_error(ArgumentError, "while logging")
      expect(release.call.decision).to eq(:ran)
      expect(runs).to be_empty
    end
  end

  describe "interrupts while a statement is in flight (GVL released)" do
    # A claim kept by a crash whose short lease has run out: the next delivery's claim
    # statement must take the row lock (held elsewhere by `with_row_locked`).
    # Until one of the gem's statements waits on a row lock (at most 10 s).
    def wait_for_lock_wait
      conn = PG.connect(SpecServices.database_url)
      waiting = lambda do
        conn.exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idempotent_job' " \
                  "AND wait_event_type = 'Lock'").getvalue(0, 0).to_i.positive?
      end
      seen = false
      50.times { (seen = waiting.call) ? break : sleep(0.2) }
      expect(seen).to be(true)
    ensure
      conn&.close
    end

    def stale_record(job_type, key)
      expect { IdempotentJob.perform_once(job_type, key, lease: 0.3) { raise Interrupt } }.to raise_error(Interrupt)
      sleep 0.4
    end

    it "Thread#raise and Timeout reach a claim statement waiting on a row lock; the next delivery takes over" do
      key = unique_key
      stale_record("Attack::Locked", key)
      with_row_locked("Attack::Locked", key) do
        expect { Timeout.timeout(0.3) { IdempotentJob.perform_once("Attack::Locked", key) { runs << :timeout } } }
          .to raise_error(Timeout::Error)
        # The interrupted statement's cancel is sent in the background: until it lands, its
        # lock wait would be taken for the next call's.
        expect(gem_statements_running(Effects.connection)).to eq(0)
        raised = Thread.new { IdempotentJob.perform_once("Attack::Locked", key) { runs << :raised } }
        raised.report_on_exception = false
        wait_for_lock_wait
        raised.raise(ArgumentError, "stop claiming")
        expect { raised.join(10) }.to raise_error(ArgumentError, "stop claiming")
        expect(runs).to be_empty
        # Both interrupted statements were cancelled (not left to claim once the lock ends).
        expect(gem_statements_running(Effects.connection)).to eq(0)
      end
      expect(IdempotentJob.perform_once("Attack::Locked", key) { runs << :after }.decision).to eq(:ran)
      expect(runs.size).to eq(1)
      pool_still_serves
    end

    it "Thread#raise while the completion waits on a row lock: that error reaches the caller, the body never reruns" do
      key = unique_key
      lock_now = Queue.new
      locked = Queue.new
      unlock = Queue.new
      locker = Thread.new do
        lock_now.pop
        with_row_locked("Attack::Completion", key) do
          locked << true
          unlock.pop
        end
      end
      worker = Thread.new do
        IdempotentJob.perform_once("Attack::Completion", key) do
          runs << :ran
          lock_now << true
          locked.pop
          :done
        end
      end
      worker.report_on_exception = false
      wait_for_lock_wait
      worker.raise(ArgumentError, "during the completion")
      expect { worker.join(10) }.to raise_error(ArgumentError, "during the completion")
      unlock << true
      expect(locker.join(10)).to eq(locker)
      # The completion either landed or the claim waits for its lease: never a second run.
      repeat = IdempotentJob.perform_once("Attack::Completion", key) { runs << :again }
      expect(%i[completed in_progress]).to include(repeat.decision)
      expect(runs.size).to eq(1)
      pool_still_serves
    end

    %w[INT TERM].each do |signal|
      it "SIG#{signal} to a process waiting (wait:) for a live claim ends it at once; the holder completes" do
        key = unique_key
        release = live_holder("Attack::Signal#{signal}", key)
        # A fresh process (a fork would close the parent's connections when it exits).
        reader, writer = IO.pipe
        script = <<~RUBY
          require "idempotent_job"
          IdempotentJob.configure do |c|
            c.database_url = ENV.fetch("DATABASE_URL")
            # Not a ::Logger: Logger#add swallows any exception raised while it writes,
            # a signal's included.
            c.logger = Class.new do
              %i[debug info warn error].each { |level| define_method(level) { |text| $stdout.puts(text) } }
            end.new
          end
          $stdout.sync = true
          IdempotentJob.perform_once(ARGV[0], ARGV[1], wait: 60) { exit!(3) }
          exit!(4)
        RUBY
        pid = Process.spawn({ "DATABASE_URL" => SpecServices.database_url }, RbConfig.ruby, "-I",
                            File.expand_path("../../lib", __dir__), "-e", script, "Attack::Signal#{signal}", key,
                            out: writer, err: File::NULL)
        writer.close
        line = +""
        line << reader.readpartial(4096) until line.include?("waiting up to") || !reader.wait_readable(10)
        expect(line).to include("waiting up to")
        Process.kill(signal, pid)
        ended = Timeout.timeout(10) { Process.wait2(pid)[1] }
        expect(ended.termsig).to eq(Signal.list.fetch(signal))
        expect(release.call.decision).to eq(:ran)
        expect(status("Attack::Signal#{signal}", key)).to eq(:completed)
      ensure
        reader&.close
        Process.kill(:KILL, pid) if pid && !ended
      end
    end
  end

  describe "nesting, threads, fibers, fork, GC" do
    it "a nested delivery of the same operation does not run and does not wait for itself forever" do
      key = unique_key
      outer = IdempotentJob.perform_once("Attack::Nested", key) do
        IdempotentJob.perform_once("Attack::Nested", key) { runs << :inner }.decision
      end
      expect(outer.value).to eq(:in_progress)
      expect(runs).to be_empty
      expect(status("Attack::Nested", key)).to eq(:completed)
    end

    it "a nested delivery of the same operation with wait: answers in_progress at once (never waits for itself)" do
      key = unique_key
      outer = IdempotentJob.perform_once("Attack::NestedWait", key) do
        IdempotentJob.perform_once("Attack::NestedOther", unique_key) do
          Timeout.timeout(10, ArgumentError) do
            IdempotentJob.perform_once("Attack::NestedWait", key, wait: 60) { runs << :inner }.decision
          end
        end
      end
      expect(outer.value.value).to eq(:in_progress)
      expect(runs).to be_empty
      expect(status("Attack::NestedWait", key)).to eq(:completed)
    end

    it "many threads on one operation: the body runs once, every thread ends" do
      key = unique_key
      threads = Array.new(8) do
        Thread.new do
          IdempotentJob.perform_once("Attack::Many", key) do
            runs << :ran
            sleep 0.05
          end.decision
        end
      end
      decisions = threads.map { |t| t.join(30).value }
      expect(runs.size).to eq(1)
      expect(decisions.count(:ran)).to eq(1)
      pool_still_serves
    end

    it "from a Fiber, and a body that yields its fiber: runs once, completes" do
      key = unique_key
      fiber = Fiber.new do
        IdempotentJob.perform_once("Attack::Fiber", key) do
          Fiber.yield(:paused)
          :done
        end.decision
      end
      expect(fiber.resume).to eq(:paused)
      expect(fiber.resume).to eq(:ran)
      expect(status("Attack::Fiber", key)).to eq(:completed)
    end

    it "a forked child on its parent's store runs a delivery; the parent's pool still serves" do
      IdempotentJob.perform_once("Attack::Fork", unique_key) { :warm }
      key = unique_key
      pid = fork do
        outcome = IdempotentJob.perform_once("Attack::Fork", key) { :child }
        exit!(outcome.decision == :ran ? 0 : 1)
      end
      _, child = Process.wait2(pid)
      expect(child.exitstatus).to eq(0)
      expect(IdempotentJob.perform_once("Attack::Fork", key) { runs << :parent }.decision).to eq(:completed)
      pool_still_serves
    end

    it "GC.compact and GC.stress during a delivery: the value and the stored result survive", :no_gc_stress do
      key = unique_key
      outcome = IdempotentJob.perform_once("Attack::GC", key, store_result: true) do
        GC.compact
        GC.stress = true
        { "list" => Array.new(50) { |i| "v#{i}" } }
      ensure
        GC.stress = false
      end
      expect(outcome.value["list"].size).to eq(50)
      GC.compact
      expect(IdempotentJob.perform_once("Attack::GC", key, store_result: true) { runs << :again }.value["list"].last)
        .to eq("v49")
    end
  end

  describe "raising callbacks and unstorable values" do
    it "a raising logger: the body ran once, its completion stands" do
      key = unique_key
      IdempotentJob.configuration.logger = Logger.new(StringIO.new).tap do |log|
        log.formatter = proc { raise IOError, "log disk full" }
      end
      begin
        IdempotentJob.perform_once("Attack::Logger", key) { runs << :ran }
      rescue IOError
        nil
      end
      expect(runs.size).to eq(1)
      expect(status("Attack::Logger", key)).to eq(:completed)
    end

    it "a subscriber raising an error whose #message raises: logged and skipped, the delivery's value stands" do
      bad = Class.new(StandardError) { def message = raise(ArgumentError, "no message for you") }
      handle = IdempotentJob::Events.subscribe(:delivered) { raise bad }
      expect(IdempotentJob.perform_once("Attack::SubscriberMessage", unique_key) { :done }.value).to eq(:done)
    ensure
      IdempotentJob::Events.unsubscribe(handle) if handle
    end

    it "a subscriber raising a non-StandardError under transaction: true: re-raised, the transaction ended" do
      fatal = Class.new(Exception) # rubocop:disable Lint/InheritException -- what Events does not rescue
      key = unique_key
      handle = IdempotentJob.subscribe(:claimed) { raise fatal, "subscriber" }
      begin
        expect { IdempotentJob.perform_once("Attack::TxSubscriber", key, transaction: true) { runs << :ran } }
          .to raise_error(fatal, "subscriber")
      ensure
        IdempotentJob::Events.unsubscribe(handle)
      end
      # Not left idle in transaction holding the record's row lock until a GC.
      idle = Effects.connection.exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = " \
                                     "'idempotent_job' AND state LIKE 'idle in transaction%'").getvalue(0, 0).to_i
      expect(idle).to eq(0)
      repeat = IdempotentJob.perform_once("Attack::TxSubscriber", key, transaction: true) { runs << :again }
      expect(repeat.decision).to eq(:completed)
      expect(runs.size).to eq(1)
    end

    it "a body returning a cycle, a Proc or an IO with store_result: completed, not stored, not run again" do
      cycle = [].tap { |a| a << a }
      [cycle, proc {}, $stdout].each_with_index do |value, i|
        key = "#{unique_key}-#{i}"
        expect(IdempotentJob.perform_once("Attack::Unstorable", key, store_result: true) { value }.decision).to eq(:ran)
        repeat = IdempotentJob.perform_once("Attack::Unstorable", key, store_result: true) { runs << :again }
        expect([repeat.decision, repeat.result_stored?]).to eq([:completed, false])
      end
      expect(runs).to be_empty
    end
  end
end
