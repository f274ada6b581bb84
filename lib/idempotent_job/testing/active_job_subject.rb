# frozen_string_literal: true

require "json"

module IdempotentJob
  # See lib/idempotent_job/testing.rb.
  module Testing
    # The kit's kind for an ActiveJob class (see {Subjects}): a payload is the job's
    # serialized form (`job.serialize`, through JSON, carrying the kit's lease as
    # `idempotency_lease`); a delivery deserializes it and runs `perform_now` inside
    # ActiveJob's execute callbacks, as every adapter's worker does, so it goes through
    # the job's callbacks and the ActiveJob door. A copy the door re-enqueues
    # (`retry_job`) is handed to the kit instead of the job's adapter. No adapter or
    # Sidekiq test mode is changed.
    class ActiveJobSubject < ClassSubject
      # Stands in for the queue adapter of one delivered job: records the re-enqueue.
      class Capture
        # @param job [ActiveJob::Base]
        # @return [void]
        def enqueue(job)
          Recorder.current&.deferred!(JSON.parse(JSON.generate(job.serialize)))
        end

        # @param job [ActiveJob::Base]
        # @param _timestamp [Float]
        # @return [void]
        def enqueue_at(job, _timestamp)
          enqueue(job)
        end
      end

      # Makes JOB enqueue into CAPTURE instead of its adapter, and so every copy made of it:
      # from ActiveJob 7.1 `retry_job` enqueues `dup` (which has none of the job's singleton
      # methods), 6.1 the job itself.
      # @param job [ActiveJob::Base]
      # @param capture [Capture]
      # @return [void]
      def self.capture_enqueues(job, capture)
        job.define_singleton_method(:queue_adapter) { capture }
        job.define_singleton_method(:dup) { super().tap { |copy| ActiveJobSubject.capture_enqueues(copy, capture) } }
      end

      # @return [Boolean] for an ActiveJob class
      def self.handles?(job)
        IdempotentJob::ActiveJob.job_class?(job)
      end

      # @return [JobOptions, nil] nil when the class does not include IdempotentJob::ActiveJob
      def options
        return nil unless @job_class.respond_to?(:idempotency_options)

        @job_class.idempotency_options(lease: @lease)
      end

      # @param args [Array]
      # @return [String, nil]
      def operation_key(args)
        key = options&.key
        key&.operation_key(IdempotentJob::ActiveJobDoor::Arguments.keyable(args))
      end

      # @param args [Array]
      # @return [Hash] the serialized job, as a queue would carry it (not enqueued)
      def enqueue(args)
        job = @job_class.new(*args)
        job.idempotency_lease = @lease if job.respond_to?(:idempotency_lease=)
        JSON.parse(JSON.generate(job.serialize))
      end

      # @return [String] the job_id
      def id(payload)
        payload["job_id"]
      end

      # Delivers one payload on the current thread, as an adapter's worker would.
      # @return [Object] perform_now's value
      def deliver(payload)
        capture = Capture.new
        run = lambda do
          # As an adapter's worker does (`ActiveJob::Base.execute`), with the job adjusted
          # once deserialized: deserialized, inside ActiveJob's execute callbacks, through
          # the job's perform callbacks.
          job = ::ActiveJob::Base.deserialize(payload)
          self.class.capture_enqueues(job, capture)
          job.define_singleton_method(:perform) { |*args| Probe.around { super(*args) } }
          ::ActiveJob::Callbacks.run_callbacks(:execute) { job.perform_now }
        end
        Testing.disabled? ? IdempotentJob::ActiveJob.unprotected(&run) : run.call
      end

      # @return [Array(Object, Array)] the block's value; jobs the body enqueued are
      #   left to the job's adapter
      def around_scenario
        [yield, []]
      end
    end

    Subjects.register(ActiveJobSubject)
  end
end
