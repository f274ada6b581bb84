# frozen_string_literal: true

module IdempotentJob
  # Reject at enqueue, opt-in (`idempotency_on_enqueue: :skip_completed` for Sidekiq,
  # `on_enqueue: :skip_completed` for ActiveJob): a producer's push of an operation
  # already completed is dropped before it reaches the queue. One read-only statement
  # per push (`COMPLETED_SQL` in the core); an operation that is not completed (no
  # record, claimed, released, held, given up) is always pushed. The doors call it
  # only for a producer's first push, never for a queue's re-push (a retry, a
  # scheduled job coming due) or the gem's own deferral.
  module EnqueueCheck
    # What `on_enqueue` accepts: :push (the default: every push is queued; a completed
    # operation's delivery is turned away by its claim) or :skip_completed (the core's table).
    POLICIES = Configuration::JOB_OPTIONS.fetch(:on_enqueue).fetch(:allowed).map(&:to_sym).freeze

    module_function

    # Whether to drop this push. When it does, it logs one line (info) and publishes
    # the `enqueue_skipped` event (job_type, operation_key, job_class, queue, door,
    # duration: the lookup's round trip in seconds, outcome: :rejected_at_enqueue, the
    # core's telemetry label, as on `delivered`).
    #
    # When the database cannot answer, the push goes ahead and a warning is logged:
    # the delivery is still decided by its claim, so nothing runs twice.
    # The operation key of the push is checked first, whatever `on_enqueue` says, so a
    # bad declaration or argument fails in the producer rather than in the worker.
    # @param options [JobOptions] the job's resolved options (their name is the job class's)
    # @param args [Array] the job's arguments as its key declaration reads them
    # @param door [Symbol] :sidekiq or :active_job
    # @param queue [String, nil] the queue it was pushed to
    # @return [Boolean] true: the operation is completed and the push must be dropped
    # @raise [OperationKeyError] when the arguments yield no valid operation key ({JobOptions#checked_key})
    # Reads idempotent_job_records (one primary-key lookup); writes nothing.
    def drop?(options, args, door:, queue:)
      operation_key = options.checked_key(args)
      return false unless options.on_enqueue == :skip_completed

      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      return false unless IdempotentJob.store.completed(options.scope, operation_key)

      duration = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      IdempotentJob.logger&.info("idempotent_job: #{options.name} operation #{operation_key.inspect} is already " \
                                 "completed: push to #{queue.inspect} dropped (on_enqueue: :skip_completed)")
      if Events.listened?(:enqueue_skipped)
        Events.publish(:enqueue_skipped, job_type: options.scope, operation_key:, job_class: options.name, queue:,
                                         door:, duration:, outcome: Native::REJECTED_AT_ENQUEUE)
      end
      true
    rescue ConnectionError, TimeoutError, DatabaseError => e
      IdempotentJob.logger&.warn("idempotent_job: #{options.name} operation #{operation_key.inspect}: the " \
                                 "on_enqueue check failed (#{e.class}: #{e.message}); pushed anyway, its " \
                                 "delivery is decided by its claim")
      false
    end
  end
end
