# frozen_string_literal: true

module IdempotentJob
  # See lib/idempotent_job/testing.rb.
  module Testing
    # The kit's kind for a Sidekiq job class (see {Subjects}). Payloads are made by a
    # Sidekiq client (its middleware, the class's sidekiq_options, a JSON round trip)
    # whose push is stopped by {SidekiqCapture}; deliveries run through
    # `Sidekiq::Testing.server_middleware` with the gem's middleware (its kit subclass).
    # No Sidekiq test mode is set or nested: the user's fake, inline or disabled mode
    # stays as it is, and only decides where jobs the body enqueues go.
    class SidekiqSubject < ClassSubject
      # @return [Boolean] for a class that includes Sidekiq::Job (Sidekiq::Worker)
      def self.handles?(job)
        job.is_a?(Class) && job.include?(IdempotentJob::Sidekiq::Compat.job_module)
      end

      # @return [JobOptions, nil]
      def options
        return @options if defined?(@options)

        @options = IdempotentJob::Sidekiq::Options.resolve(@job_class, @job_class.get_sidekiq_options)
      end

      # @param args [Array]
      # @return [String, nil]
      def operation_key(args)
        options&.key&.operation_key(JSON.parse(JSON.generate(args)))
      end

      # @param args [Array]
      # @return [Hash] the payload, with the kit's lease as `idempotency_lease`
      # @raise [Error] when a client middleware (other than the kit's) stopped the push
      def enqueue(args)
        holder = []
        client = SidekiqCompat.client_with(SidekiqCapture, holder)
        # As a producer's arguments reach a worker: through JSON (symbol keys become strings).
        # The kit replays deliveries: `on_enqueue: push` keeps a job's reject-at-enqueue
        # option from dropping a copy of an operation it already completed.
        client.push("class" => @job_class, "args" => JSON.parse(JSON.generate(args)), "idempotency_lease" => @lease,
                    IdempotentJob::Sidekiq::Options::KEYS[:on_enqueue] => "push")
        holder.first || raise(Error, "#{@job_class}: a client middleware stopped the push")
      end

      # @return [String] the jid
      def id(payload)
        payload["jid"]
      end

      # Delivers one payload on the current thread, as Sidekiq's processor would.
      # @return [Object] the chain's value
      def deliver(payload)
        worker = @job_class.new
        worker.jid = payload["jid"]
        chain.invoke(worker, payload, payload["queue"]) { worker.perform(*payload["args"]) }
      end

      # Runs the scenario; in fake mode, takes out of the fake queues what the body
      # pushed during it.
      # @return [Array(Object, Array<Hash>)]
      def around_scenario
        return [yield, []] unless SidekiqCompat.fake?

        saved = FakeQueues.snapshot
        begin
          value = yield
          [value, FakeQueues.added_since(saved)]
        ensure
          FakeQueues.restore(saved)
        end
      end

      private

      def chain
        chain = ::Sidekiq::Testing.server_middleware.dup
        gem = IdempotentJob::Sidekiq::ServerMiddleware
        if Testing.disabled?
          chain.remove(gem)
        elsif chain.exists?(gem)
          chain.insert_after(gem, SidekiqMiddleware)
          chain.remove(gem)
        elsif !chain.exists?(SidekiqMiddleware)
          chain.add(SidekiqMiddleware)
        end
        chain.remove(Probe)
        chain.add(Probe)
        chain
      end
    end

    Subjects.register(SidekiqSubject)
  end
end
