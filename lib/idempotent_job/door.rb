# frozen_string_literal: true

module IdempotentJob
  # What a door (a queue's integration, or the plain API) tells the {Protocol}: what counts
  # as a crash, how a delivery that meets a live claim comes back later, where the
  # decisions are logged, and how a delivery's id is named in messages. Subclass it
  # and override what differs; the base class is the plain Ruby door's behaviour.
  class Door
    # @param error [Exception] what the block raised
    # @return [Boolean] true when the error means the worker is going away (a hard
    #   shutdown): the claim is then kept for its lease to decide instead of released.
    #   Default: an interrupt or signal (Interrupt, SignalException: Ctrl-C, an
    #   untrapped SIGTERM), whose body may have done its effect.
    def crash?(error)
      error.is_a?(SignalException)
    end

    # @return [String] how a crash is described in the log (e.g. "<queue> is shutting down")
    def crash_text
      "the worker is shutting down (interrupt or signal)"
    end

    # Brings a delivery that met a live claim back later. Called before the decision
    # is logged and published; raise to fail the delivery rather than lose it.
    # @param delivery [Delivery] the delivery
    # @param outcome [Outcome] its :in_progress outcome (`retry_after`, `lease_remaining`, `holder`)
    # @return [void]
    # @raise [Error] when the delivery cannot be brought back
    def defer(_delivery, _outcome)
      nil
    end

    # @return [String] how a deferral is described in the log (after "deferred")
    def defer_text
      "retry after"
    end

    # @return [Logger] where decisions are logged (default {IdempotentJob.logger})
    def logger
      IdempotentJob.logger
    end

    # @return [String] the word for a delivery's id in messages ("jid", "job_id", "delivery")
    def id_label
      "delivery"
    end

    # The door's name in events and telemetry (`delivered`'s `door:`).
    # @return [Symbol] :plain here; :sidekiq, :active_job in their doors
    def name
      :plain
    end

    # Enqueues the stored job of a record resolved with `IdempotentJob.resolve(…, as: :rerun)`,
    # when it is this door's kind of job.
    # @param _record [Record] the record (job_class, args, queue of the last claiming delivery)
    # @return [Boolean] whether this door enqueued it (default false)
    def rerun(_record)
      false
    end

    # @return [Logger, nil] the logger of the door's queue, used when none is configured (default nil)
    def host_logger
      nil
    end

    # @return [Integer, nil] worker threads of the door's queue in this process, which
    #   size the default pool (default nil)
    def concurrency
      nil
    end

    private

    # Fails a delivery {#defer} could not bring back, rather than lose it.
    # @param delivery [Delivery]
    # @param problem [String] what went wrong
    # @raise [Error] always, naming the job type, the operation key, the delivery's id and the problem
    def not_deferred!(delivery, problem)
      raise Error, "#{delivery.job_type} operation #{delivery.operation_key.inspect} " \
                   "(#{id_label} #{delivery.id}): #{problem}"
    end

    @registered = []
    @registry_lock = Mutex.new

    class << self
      # Registers a door for what is not per delivery: reruns, the default logger and
      # pool size. A door registers itself when its file is required; once per class.
      # @param door [Door]
      # @return [Door] the door
      def register(door)
        @registry_lock.synchronize do
          @registered = @registered.reject { |d| d.instance_of?(door.class) } + [door]
        end
        door
      end

      # @return [Array<Door>] the registered doors, latest first
      def registered
        @registry_lock.synchronize { @registered.reverse }
      end
    end

    # The plain door's shared instance.
    PLAIN = new.freeze
  end
end
