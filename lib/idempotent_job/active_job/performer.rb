# frozen_string_literal: true

module IdempotentJob
  module ActiveJobDoor
    # Runs one delivery of an ActiveJob job through the {Protocol}, from the job's
    # `around_perform` callback: the operation key from the deserialized arguments,
    # the serialized arguments as the payload (digest, and what a rerun enqueues), the
    # job_id as the delivery's id. Internal.
    class Performer
      # Thread-local list of job_ids being re-enqueued by {Door#defer} on this thread.
      DEFERRING = :idempotent_job_active_job_deferring
      private_constant :DEFERRING

      class << self
        # The `before_enqueue` check: a fresh job whose arguments yield no operation
        # key (or one over the record's limits) fails in the caller of `perform_later`,
        # not in the worker; with `on_enqueue: :skip_completed`, a fresh job of an
        # operation already completed is not enqueued (`throw :abort`: perform_later
        # returns false; see {EnqueueCheck}). Re-enqueues of a job that was performed
        # (retry_on, the door's deferrals: `executions` above 0) are not checked.
        # @param job [ActiveJob::Base]
        # @return [void]
        # @raise [OperationKeyError, ConfigurationError] as the worker would
        # @throw :abort when the push is dropped
        def check_enqueue(job)
          return if job.instance_variable_get(:@idempotency_performed) || job.executions.to_i.positive? ||
                    IdempotentJob::ActiveJob.unprotected?

          options = job.class.idempotency_options
          return unless options

          args = Arguments.keyable(job.arguments)
          throw :abort if EnqueueCheck.drop?(options, args, door: :active_job, queue: job.queue_name)
          job.idempotency_producer ||= Producer.current
        end

        # Runs the block (a `retry_job`) with the job marked as being deferred on this
        # thread: an adapter that performs it right there (Sidekiq's inline testing
        # mode) delivers a copy that must wait in place, not defer again.
        # @param job [ActiveJob::Base]
        # @return [Object] the block's value
        def deferring(job)
          ids = (Thread.current[DEFERRING] ||= [])
          ids.push(job.job_id)
          yield
        ensure
          ids.pop
        end

        # @return [Boolean] whether this job_id is being deferred further up this thread
        def deferring?(job)
          Thread.current[DEFERRING]&.include?(job.job_id) || false
        end
      end

      # @param job [ActiveJob::Base] the job being performed (arguments deserialized)
      def initialize(job)
        @job = job
      end

      # @yield the rest of the perform callbacks and `perform`
      # @return [Object] the block's value when it ran, else nil
      # @raise [OperationKeyError] when the arguments yield no operation key (not run)
      # @raise [ConnectionError, DatabaseError, LookupError, PayloadMismatchError,
      #   LostClaimError] as {Protocol#run}; whatever `perform` raised
      def call(&body)
        options = @job.class.idempotency_options(lease: @job.idempotency_lease)
        return yield if options.nil? || IdempotentJob::ActiveJob.unprotected?

        @job.instance_variable_set(:@idempotency_performed, true)
        # The key is checked by the core's one call (`Native::Protocol#perform`).
        key = options.key.operation_key(Arguments.keyable(@job.arguments), job_type: options.scope)
        run(options, key, body)
      end

      private

      def run(options, key, body)
        in_place = in_place?
        protocol = Protocol.new(options, door: Door.new(@job, in_place:))
        payload = ::ActiveJob::Arguments.serialize(@job.arguments)
        deferrals = @job.idempotency_deferrals
        loop do
          outcome = protocol.run(delivery(options, key, payload, deferrals), host: @job) { body.call }
          # A replay's value, for perform_now to return ({IdempotentJob::ActiveJobDoor::Replaying}).
          @job.instance_variable_set(:@idempotency_replay, [outcome.value]) if outcome.replayed?
          return outcome.value unless in_place && outcome.in_progress?

          # Inline: nowhere to re-enqueue to; wait here (the caller is waiting anyway).
          sleep(outcome.retry_after)
          deferrals += 1
        end
      end

      def delivery(options, key, payload, deferrals)
        Delivery.queued(options, operation_key: key, payload:, job_class: @job.class.name, queue: @job.queue_name,
                                 id: @job.job_id, deferrals:, producer: @job.idempotency_producer,
                                 facts: { "job_id" => @job.job_id, "executions" => @job.executions,
                                          "enqueued_at" => enqueued_at, "provider_job_id" => @job.provider_job_id })
      end

      # The job's enqueue time as ISO 8601 text: ActiveJob 7.1+ gives a Time (6.1 the text
      # it serialized), and facts hold JSON values only (a Time refused the delivery).
      def enqueued_at
        at = @job.enqueued_at
        at.respond_to?(:utc) ? at.utc.iso8601(6) : at
      end

      def in_place?
        # The inline adapter performs at enqueue and cannot schedule a later delivery.
        @job.queue_adapter.is_a?(::ActiveJob::QueueAdapters::InlineAdapter) || self.class.deferring?(@job)
      end
    end
  end
end
