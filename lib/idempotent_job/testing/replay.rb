# frozen_string_literal: true

require "json"
require "timeout"

module IdempotentJob
  module Testing
    # What one scenario did, and whether it kept the job's effect to once (or to what
    # its stale policy allows).
    #
    # Members: scenario (Symbol), description (String, the delivery pattern),
    # deliveries (Array<Delivery>), effects (Integer, how many times the effect
    # happened: the change of the `effect` block, or body runs without one),
    # observations (Array<String>, effects seen at each step), record
    # (IdempotentJob::Record or nil, the operation's record at the end), allowance
    # (String or nil, a duplicate the stale policy permits), violations
    # (Array<String>, empty when the scenario passed), enqueued (Array<Hash>, jobs
    # the body enqueued in this process — not in forked workers — removed from the
    # fake queues afterwards).
    Result = Struct.new(:scenario, :description, :deliveries, :effects, :observations, :record, :allowance,
                        :violations, :enqueued, keyword_init: true) do
      # @return [Boolean] whether the scenario kept its expectations
      def passed?
        violations.empty?
      end

      # @return [Integer] deliveries whose body ran (a worker killed after its effect counts)
      def runs
        deliveries.count(&:ran)
      end

      # @return [String] a multi-line report: pattern, verdict, deliveries, record
      def to_s
        lines = [header]
        lines.concat(violations.map { |v| "  ✗ #{v}" })
        lines << "  allowed: #{allowance}" if allowance
        lines.concat(observations.map { |o| "  · #{o}" })
        lines.concat(deliveries.map { |d| "    #{d}" })
        lines << "  record: #{record ? "#{record.status}, #{record.attempts} claim(s)" : "none"}"
        lines << "  enqueued by the body: #{enqueued.map { |job| job["class"] }.tally}" if enqueued&.any?
        lines.join("\n")
      end

      private

      def header
        "#{description}: #{passed? ? "ok" : "FAILED"} (effect happened #{effects} time(s))"
      end
    end

    # Replays deliveries of one operation of a job through its door (a Sidekiq job
    # class through its server middleware chain, a {PlainJob} through perform_once;
    # further doors add a kind to {Subjects}) against the real database, and reports
    # what happened.
    #
    #   replay = IdempotentJob::Testing::Replay.new(ChargeOrderJob, { order_id: 42, amount_cents: 1500 },
    #                                               effect: -> { Charge.where(order_id: 42).count })
    #   replay.repeated(times: 3).passed?
    #
    # Each scenario starts from no record for the operation (it is deleted first) and
    # measures the effect as a change of the `effect` block's value, so the block must
    # read state every worker writes to: the database, a file, a stand-in service —
    # not a Ruby object, which forked workers cannot change. Deliveries carry the kit's
    # short lease ({Testing.lease}) as `idempotency_lease`.
    class Replay
      # Scenarios, in the order the matcher runs them.
      SCENARIOS = %i[repeated concurrent_threads concurrent_processes killed_after_claim killed_after_effect
                     distinct same_operation].freeze
      # Seconds to wait for a worker to reach its stop point or finish.
      WORKER_TIMEOUT = 60

      # @return [Class] the job class
      attr_reader :job_class
      # @return [Array] perform's positional arguments, as they will be delivered
      attr_reader :args

      # @param job_class [Class, PlainJob] a Sidekiq job class (includes Sidekiq::Job/Worker),
      #   a {PlainJob}, or another job a registered {Subjects} kind handles
      # @param args [Array, Hash] perform's arguments: positional, or a Hash by
      #   parameter name (`{ order_id: 42 }` for `perform(order_id)`)
      # @param effect [#call, nil] returns a number counting the effect (e.g. rows);
      #   nil counts body runs instead
      # @param effect_at [String, nil] "Class#method" or "Class.method": a worker
      #   killed "after the effect" dies as this method returns, inside the body;
      #   nil: as the body returns, before the completion is recorded
      # @param lease [Numeric] the deliveries' lease in seconds
      # @raise [ArgumentError] when the arguments do not fit perform's parameters or
      #   `effect_at` names no such method
      def initialize(job_class, args, effect: nil, effect_at: nil, lease: Testing.lease)
        @job_class = job_class
        @lease = lease.to_f
        @subject = Subjects.for(job_class, lease: @lease)
        @args = @subject.positional(args)
        @effect = effect
        @effect_at = effect_at && EffectPoint.parse(effect_at)
        @lock = Mutex.new
      end

      # The same message delivered `times` times in a row, each a new enqueue of the
      # same arguments (a producer re-enqueuing, a retry after a lost acknowledgement).
      # Expected: the effect once.
      # @param times [Integer] deliveries (≥ 2)
      # @return [Result]
      def repeated(times: 3)
        scenario(:repeated, "the same arguments delivered #{times} times in a row") do |run|
          times.times { |i| run.deliveries << deliver(enqueue, "delivery #{i + 1}") }
          run.expect_effects(1)
        end
      end

      # `workers` deliveries of the same arguments started together (a barrier
      # releases them at once), on threads or forked processes; copies the gem pushed
      # back are delivered once all have finished. Expected: the effect once.
      # @param workers [Integer] concurrent deliveries (≥ 2)
      # @param via [Symbol] :threads or :processes
      # @param hold [Numeric] seconds a delivery that ran the body waits before its
      #   completion is recorded, so the others arrive while it holds the claim
      # @return [Result]
      # @raise [ArgumentError] for another `via`
      def concurrent(workers: 3, via: :threads, hold: 0.2)
        raise ArgumentError, "via: must be :threads or :processes, got #{via.inspect}" unless
          %i[threads processes].include?(via)

        name = :"concurrent_#{via}"
        scenario(name, "#{workers} workers (#{via}) delivering the same arguments at once") do |run|
          payloads = Array.new(workers) { enqueue }
          Probe.hold = hold
          begin
            run.deliveries.concat(via == :threads ? race_threads(payloads) : race_processes(payloads))
          ensure
            Probe.hold = nil
          end
          run.observe("after the race")
          deliver_deferred(run)
          run.expect_effects(1)
        end
      end

      # A worker is SIGKILLed after its claim (before the body) or after its effect
      # (as the body returns, or as `effect_at` returns), holding the claim. Then the
      # same message is redelivered before its lease ends, and again after it (the
      # copy the gem pushed back, and the killed delivery itself, as a reliable fetch
      # would bring it back).
      # Expected: nothing runs while the dead worker's lease is live; afterwards the
      # effect once — or as the stale policy allows: under :reclaim a kill after the
      # effect may repeat it once; under :hold/:skip the operation may end held/given
      # up (never lost). A transactional job's effect is rolled back with its claim.
      # @param after [Symbol] :claim or :effect
      # @return [Result]
      # @raise [ArgumentError] for another `after`
      def killed(after:)
        raise ArgumentError, "after: must be :claim or :effect, got #{after.inspect}" unless
          %i[claim effect].include?(after)

        where = after == :claim ? "after its claim" : "after its effect (#{@effect_at || "the body returned"})"
        scenario(:"killed_after_#{after}", "a worker SIGKILLed #{where}, then redeliveries before and after " \
                                           "the lease") do |run|
          killed_run(run, after)
        end
      end

      # Two different operations (these arguments and `other_args`), one delivery
      # each. Expected: the effect twice — an operation key that does not tell them
      # apart turns the second away. The `effect` block must count both.
      # @param other_args [Array, Hash] arguments of another operation
      # @return [Result]
      def distinct(other_args)
        other = @subject.positional(other_args)
        scenario(:distinct, "two distinct operations (#{@args.inspect} and #{other.inspect}) delivered once " \
                            "each") do |run|
          forget(other)
          run.deliveries << deliver(enqueue, "operation 1")
          run.deliveries << deliver(enqueue(other), "operation 2")
          run.expect_effects(2, why: "the operation key does not tell these operations apart")
        end
      end

      # The same operation delivered twice with arguments that differ only where the
      # operation key does not look (a request time, a trace id), as a re-enqueue by
      # a producer would. Expected: the effect once — an operation key that includes
      # an argument which varies between deliveries runs it twice.
      # @param other_args [Array, Hash] arguments of the same operation
      # @return [Result]
      def same_operation(other_args)
        other = @subject.positional(other_args)
        scenario(:same_operation, "one operation delivered with #{@args.inspect} and again with " \
                                  "#{other.inspect}") do |run|
          forget(other)
          run.deliveries << deliver(enqueue, "delivery 1")
          run.deliveries << deliver(enqueue(other), "delivery 2 (other arguments)")
          run.expect_effects(1, why: "the operation key tells these deliveries of one operation apart: it " \
                                     "includes an argument that varies between deliveries")
        end
      end

      # @return [JobOptions, nil] the job's resolved idempotency options (nil: the job
      #   declares no idempotency_key and is not protected)
      def options
        @subject.options
      end

      # @return [String, nil] the operation key of these arguments (nil when unprotected)
      def operation_key(args = @args)
        @subject.operation_key(args)
      end

      # @return [IdempotentJob::Record, nil] the operation's record now
      def record
        key = operation_key
        key && IdempotentJob.record(options.scope, key)
      end

      # @return [Integer] the effect block's value now, or body runs counted so far
      def effect_value
        return @runs_so_far.to_i unless @effect

        value = @effect.call
        raise ArgumentError, "the effect block must return a number (a count), got #{value.inspect}" unless
          value.is_a?(Numeric)

        value
      end

      private

      # One scenario's bookkeeping: deliveries, effects observed, violations.
      class Run
        attr_reader :deliveries, :observations, :violations
        attr_accessor :allowance

        # @param replay [Replay] the replay whose effect and record are observed
        # @param baseline [Integer] the effect value when the scenario began
        def initialize(replay, baseline)
          @replay = replay
          @baseline = baseline
          @deliveries = []
          @observations = []
          @violations = []
        end

        # @return [Integer] effects since the scenario began
        def effects
          @replay.effect_value - @baseline
        end

        # Notes the effect count and the record's status at a step of the scenario.
        # @return [Integer] the effect count
        def observe(moment)
          status = @replay.record&.status
          effects.tap do |count|
            @observations << "#{moment}: effect #{count} time(s), record #{status || "none"}"
          end
        end

        # Records a broken promise of the scenario (the Result then fails).
        # @param text [String] what went wrong, in the report's words
        # @return [void]
        def violation(text)
          @violations << text
        end

        # Observes the effect count at the end and records a violation, naming the
        # deliveries whose body ran or raised, unless it is exactly `count`.
        # @param count [Integer] effects expected since the scenario began
        # @param why [String, nil] the likely cause, appended to the violation
        # @return [void]
        def expect_effects(count, why: nil)
          actual = observe("at the end")
          return if actual == count

          ran = @deliveries.select(&:ran).map(&:label)
          raised = @deliveries.select { |d| d.outcome == :raised }.map(&:label)
          text = "the effect happened #{actual} time(s), expected #{count == 1 ? "once" : count}"
          text += "; the body ran in #{ran.join(", ")}" if ran.any?
          text += "; it raised in #{raised.join(", ")}" if raised.any?
          text += " (#{why})" if why
          violation(text)
        end
      end

      def scenario(name, description)
        run = nil
        _, enqueued = @subject.around_scenario do
          forget(@args)
          @runs_so_far = 0
          run = Run.new(self, effect_value)
          yield run
        end
        Result.new(scenario: name, description:, deliveries: run.deliveries, effects: run.effects,
                   observations: run.observations, record:, allowance: run.allowance, violations: run.violations,
                   enqueued:)
      end

      def forget(args)
        key = operation_key(args)
        Testing.forget(options.scope, key) if key
      end

      # A payload of these arguments as the queue would deliver it (through the door's
      # client side and JSON), not put on any queue.
      def enqueue(args = @args)
        @subject.enqueue(args)
      end

      # Delivers one payload on the current thread through the subject's door.
      # @return [Delivery]
      def deliver(payload, label)
        delivery = Delivery.new(label:, jid: @subject.id(payload), outcome: :not_run, ran: false)
        recorder = Recorder.new(delivery)
        recorder.attach do
          @subject.deliver(payload)
        rescue StandardError, ScriptError => e # what a queue would count as a failed job (NotImplementedError…)
          recorder.raised!(e)
        end
        count_run if delivery.ran
        delivery
      end

      # Delivers what the gem pushed back, as the scheduled set would once due.
      def deliver_deferred(run, label = "pushed-back copy")
        pending = run.deliveries.flat_map { |d| d.deferred.to_a }
        run.deliveries.each { |d| d.deferred = [] }
        pending.each_with_index do |payload, i|
          run.deliveries << deliver(payload, "#{label} #{i + 1}")
        end
      end

      def race_threads(payloads)
        ready = Queue.new
        gate = Queue.new
        threads = payloads.each_with_index.map do |payload, i|
          Thread.new do
            ready << true
            gate.pop
            deliver(payload, "worker #{i + 1} (thread)")
          end
        end
        payloads.size.times { ready.pop }
        payloads.size.times { gate << true }
        threads.map { |t| t.join(WORKER_TIMEOUT)&.value || raise(Error, "#{@job_class}: a worker thread hung") }
      end

      def race_processes(payloads)
        gate_reader, gate_writer = IO.pipe
        workers = payloads.each_with_index.map do |payload, i|
          Worker.fork(self) do
            gate_writer.close
            gate_reader.read(1) # the barrier: all start when the kit closes the gate
            deliver(payload, "worker #{i + 1} (process)")
          end
        end
        gate_reader.close
        workers.each(&:wait_ready)
        gate_writer.close
        workers.map(&:result).each { |delivery| count_run if delivery.ran }
      ensure
        gate_writer&.close unless gate_writer&.closed?
        workers&.each(&:terminate!)
      end

      def killed_run(run, after)
        killed_payload = enqueue
        worker = Worker.fork(self, stop_at: after, effect_at: @effect_at) do
          deliver(killed_payload, "killed worker")
        end
        finished = worker.kill_at_stop!(after)
        return never_stopped(run, after, finished) if finished

        run.deliveries << Delivery.new(label: "killed worker", jid: @subject.id(killed_payload), outcome: :killed,
                                       ran: after == :effect, deferred: [])
        count_run if after == :effect
        after_kill = run.observe("after the kill")
        before_lease(run, after_kill)
        wait_for_lease_end
        deliver_deferred(run, "pushed-back copy (after the lease)")
        run.deliveries << deliver(killed_payload, "the killed delivery again (after the lease)")
        expect_after_stale(run, after, after_kill)
      end

      # The worker meant to be killed finished (or raised) before its stop point.
      def never_stopped(run, after, delivery)
        run.deliveries << delivery
        count_run if delivery.ran
        run.observe("after the worker finished")
        run.violation("the worker meant to be SIGKILLed after its #{after} never got there: its delivery " \
                      "#{delivery.outcome}#{" (#{delivery.error})" if delivery.error}, so there was nothing to kill")
      end

      def before_lease(run, after_kill)
        delivery = deliver(enqueue, "redelivery before the lease ended")
        run.deliveries << delivery
        now = run.observe("after a redelivery before the lease ended")
        if delivery.decision == :takeover
          run.violation(late_redelivery)
        elsif now > after_kill && !transactional?
          run.violation("a redelivery while the killed worker's lease was still live ran the body again " \
                        "(effect #{after_kill} → #{now})")
        end
      end

      def expect_after_stale(run, after, after_kill)
        final = run.observe("at the end")
        expect_not_lost(run, final)
        expect_lookup_truthful(run, after_kill)
        allowed = reclaim_allowance?(run, after, after_kill) ? 2 : 1
        if allowed == 2
          run.allowance = "one repeat: idempotency_on_stale: :reclaim reruns an operation whose worker died " \
                          "after its effect, before its completion was recorded"
        end
        return if final <= allowed

        ran = run.deliveries.select(&:ran).map(&:label)
        run.violation("the effect happened #{final} time(s), at most #{allowed} allowed; the body ran in " \
                      "#{ran.join(", ")}")
      end

      def late_redelivery
        text = "the redelivery meant to arrive before the lease ended found it already over: "
        return "#{text}the machine is too slow for a #{@lease} s lease (set IdempotentJob::Testing.lease)" if
          options&.heartbeat

        "#{text}idempotency_heartbeat is off, so the killed worker's claim was not renewed and its body " \
          "outlasted the kit's #{@lease} s lease: set IdempotentJob::Testing.lease above the body's run time"
      end

      # Nothing lost: the effect happened, or the record says a person or the policy
      # stopped it (held, given up).
      def expect_not_lost(run, final)
        status = record&.status&.to_sym
        return if final >= 1 || %i[held given_up].include?(status)

        run.violation("the operation was lost: the effect never happened and its record is " \
                      "#{status || "missing"}, not held or given up")
      end

      # A lookup asked about the dead worker's claim must not say :not_done once its
      # effect happened (nor :done before it did: that shows up as a lost operation).
      def expect_lookup_truthful(run, after_kill)
        return unless after_kill.positive? && run.deliveries.any? { |d| d.lookup == :not_done }

        run.violation("the lookup ##{options.lookup} answered :not_done although the killed worker's effect " \
                      "had happened (effect #{after_kill} after the kill), so it was run again")
      end

      # A worker killed after a non-transactional effect, under :reclaim, with no
      # lookup answer that decided: one repeat is the policy's price.
      def reclaim_allowance?(run, after, after_kill)
        decided = run.deliveries.any? { |d| %i[done not_done].include?(d.lookup) }
        after == :effect && !transactional? && options&.on_stale == :reclaim && after_kill.positive? && !decided
      end

      def count_run
        @lock.synchronize { @runs_so_far += 1 }
      end

      def transactional?
        !options&.transaction.nil?
      end

      # Waits until the operation's lease has ended by the database clock (or, with
      # no record, the kit's lease).
      def wait_for_lease_end
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @lease + WORKER_TIMEOUT
        loop do
          current = record
          return sleep(@lease + 0.1) if current.nil?
          return if current.status != :claimed || current.lease_expired
          raise Error, "#{@job_class}: the lease did not end in time" if
            Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          sleep 0.05
        end
      end
    end
  end
end

require "idempotent_job/testing/arguments"
require "idempotent_job/testing/worker"
