# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # What the Sidekiq door tells the protocol: Sidekiq::Shutdown is a crash (the
    # claim is kept), a delivery that meets a live claim is pushed back as a scheduled
    # copy carrying its deferral count, and Sidekiq's logger takes the decisions.
    class Door < IdempotentJob::Door
      # The payload key counting a delivery's deferrals ({Delivery::DEFERRALS}).
      DEFERRALS = Delivery::DEFERRALS

      # @param job_hash [Hash, nil] the payload being delivered (what a deferral copies)
      def initialize(job_hash = nil)
        super()
        @job_hash = job_hash
      end

      # @return [Boolean] for Sidekiq::Shutdown (a hard shutdown: Sidekiq requeues the job)
      def crash?(error)
        defined?(::Sidekiq::Shutdown) ? error.is_a?(::Sidekiq::Shutdown) : false
      end

      # @return [String]
      def crash_text
        "Sidekiq is shutting down"
      end

      # @return [String]
      def id_label
        "jid"
      end

      # @return [Symbol] :sidekiq (see {IdempotentJob::Door#name})
      def name
        :sidekiq
      end

      # @return [String]
      def defer_text
        "delivery deferred by"
      end

      # Pushes a copy of the payload to arrive after `outcome.retry_after` seconds.
      # @param delivery [Delivery] the delivery (of the job hash given to {#initialize})
      # @param outcome [Outcome]
      # @return [void]
      # @raise [Error] under inline testing (nothing can be deferred), or when a client
      #   middleware stopped the push (the delivery fails rather than being lost)
      def defer(delivery, outcome)
        raise ArgumentError, "#{self.class} needs the job hash to defer" unless @job_hash

        not_deferred!(delivery, "in progress under jid #{outcome.holder}; inline testing cannot defer it") if inline?
        copy = @job_hash.merge("at" => Time.now.to_f + outcome.retry_after, DEFERRALS => delivery.deferrals + 1)
        # A client middleware that stops the push would lose the delivery: fail it instead.
        not_deferred!(delivery, "the deferred copy was not pushed") unless push(copy)
      end

      # @return [Boolean] whether Sidekiq's inline testing mode is on (nothing can be deferred)
      def inline?
        Compat.inline?
      end

      # Pushes a payload through Sidekiq's client (and its middleware).
      # @param payload [Hash]
      # @return [String, nil] the jid, nil when a middleware stopped it
      def push(payload)
        ::Sidekiq::Client.push(payload)
      end

      # What a Ruby class name (with its namespaces) looks like.
      CONSTANT_PATH = /\A(?:::)?[A-Z]\w*(?:::[A-Z]\w*)*\z/

      # Enqueues the stored job of a record resolved for a rerun when it is a Sidekiq
      # job (an ActiveJob class: its door reruns it; a plain-API record, no job class,
      # or another language's record such as a Celery task's: nothing to enqueue).
      # @param record [Record]
      # @return [Boolean] whether it was enqueued here
      def rerun(record)
        return false unless record.job_class && sidekiq_job?(record)

        !push("class" => record.job_class, "args" => record.args, "queue" => record.queue || "default").nil?
      end

      # @return [Logger, nil] Sidekiq's logger, the gem's default when none is configured
      def host_logger
        ::Sidekiq.logger
      end

      # @return [Integer, nil] the server's concurrency (sizes the pool)
      def concurrency
        Compat.concurrency
      end

      private

      # A Sidekiq job class, or a name this process cannot load (a producer-only
      # process pushes by name, as before) stored with a queue: every Sidekiq delivery
      # has one, a plain-API record only when its caller gave `queue:`.
      def sidekiq_job?(record)
        klass = Object.const_get(record.job_class)
        klass.is_a?(Class) && klass.include?(Compat.job_module)
      rescue NameError
        # A name that cannot be a Ruby class (a Celery task's "tasks.charge") is another
        # language's record: its own door re-sends it, never Sidekiq.
        !record.queue.nil? && CONSTANT_PATH.match?(record.job_class)
      end
    end
  end
end
