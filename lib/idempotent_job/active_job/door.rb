# frozen_string_literal: true

module IdempotentJob
  module ActiveJobDoor
    # What the ActiveJob door tells the {Protocol} for one job: an interrupt of the
    # worker is a crash (the base class's rule; Sidekiq's hard shutdown, Sidekiq::Shutdown,
    # is an Interrupt in every supported version), and a delivery that met a live claim
    # comes back through `retry_job(wait: …)` on the job's own adapter.
    #
    # `retry_job` is not a failure: no `retry_on` counter moves (ActiveJob 6.1 to 8.1
    # count `retry_on` attempts in `exception_executions`, per exception, which only a
    # raised error changes), and `executions`, which `perform_now` raised by one for
    # this delivery, is put back first, so the re-enqueued copy carries the count of
    # runs that really happened (it is the fallback `retry_on` counter for jobs
    # serialized without `exception_executions`, and what ActiveJob's logs report).
    class Door < IdempotentJob::Door
      # @param job [ActiveJob::Base, nil] the job being performed (nil: the registered
      #   instance, which only answers {#rerun})
      # @param in_place [Boolean] true when the adapter cannot schedule (inline): the
      #   {Performer} waits and decides again instead of re-enqueueing
      def initialize(job = nil, in_place: false)
        super()
        @job = job
        @in_place = in_place
      end

      # @return [String]
      def crash_text
        "the worker of #{@job.class.name} was interrupted (shutdown or signal)"
      end

      # Re-enqueues the job to arrive after `outcome.retry_after` seconds.
      # @param delivery [Delivery]
      # @param outcome [Outcome] the :in_progress outcome
      # @return [void]
      # @raise [Exception] what the adapter raises when it cannot enqueue (the
      #   delivery then fails, to the queue's own retry, rather than being lost)
      # @raise [Error] when `retry_job` enqueued nothing (an enqueue callback halted it)
      def defer(delivery, outcome)
        return if @in_place

        @job.instance_variable_set(:@idempotency_deferrals, delivery.deferrals + 1)
        @job.executions -= 1 if @job.executions.to_i.positive?
        return if Performer.deferring(@job) { @job.retry_job(wait: outcome.retry_after) }

        not_deferred!(delivery, "its deferred copy was not enqueued (an enqueue callback halted retry_job), so " \
                                "this delivery fails instead of being lost")
      end

      # @return [String]
      def defer_text
        @in_place ? "waiting in place for" : "re-enqueued with retry_job(wait:)"
      end

      # @return [String]
      def id_label
        "job_id"
      end

      # @return [Symbol] :active_job (see {IdempotentJob::Door#name})
      def name
        :active_job
      end

      # Re-enqueues an operation resolved with `IdempotentJob.resolve(…, as: :rerun)`
      # when its job class is an ActiveJob class: `perform_later` with the stored
      # (serialized) arguments on the stored queue.
      # @param record [Record]
      # @return [Boolean] whether the record was an ActiveJob job (and was enqueued)
      # @raise [Exception] what the adapter raises when it cannot enqueue
      def rerun(record)
        klass = record.job_class && Object.const_get(record.job_class)
        return false unless IdempotentJob::ActiveJob.job_class?(klass)

        klass.set(queue: record.queue).perform_later(*::ActiveJob::Arguments.deserialize(record.args || []))
        true
      rescue NameError
        false
      end
    end
  end
end
