# frozen_string_literal: true

require_relative "../producer"

module IdempotentJob
  module Sidekiq
    # Client middleware: checks at enqueue time that a job's arguments yield a valid
    # operation key (declared, present, not empty, at most 2000 bytes with the job type,
    # no NUL), so a bad declaration or argument fails in the caller of `perform_async`
    # rather than in the worker. Touches no database.
    #
    # Only a producer's push is checked: one that passes the job class itself
    # (`perform_async`, `perform_in`, `set(...)`). A payload pushed by name — what
    # Sidekiq's retry and scheduled pollers push (perform_in's jobs when due), and the
    # gem's own deferrals — and any payload already enqueued once (`enqueued_at`) is
    # never checked again: raising there would drop the job from Redis for good.
    #
    # With `idempotency_on_enqueue: :skip_completed`, a producer's push of an operation
    # already completed is dropped here ({EnqueueCheck}: one read-only statement), so
    # `perform_async` returns nil, as for any push a client middleware stops. The
    # pushes above that are never checked are never dropped either.
    class ClientMiddleware
      # @param job_class [Class, String] the job class, or its name
      # @param job [Hash] the job payload
      # @param queue [String]
      # @param _redis_pool [ConnectionPool, nil]
      # @yield pushes the job
      # @return [Object, nil] the push's value; nil when the push was dropped
      # @raise [OperationKeyError, ConfigurationError] when the job would fail its claim,
      #   or it carries an `idempotency_*` option nobody knows (a misspelled `set(...)`);
      #   `idempotency_*` options without `idempotency_key` are pushed with a warning
      #   ({Options.warn_keyless}: the job runs unguarded)
      def call(job_class, job, queue, _redis_pool = nil, &)
        return yield if !job_class.is_a?(Class) || job.key?("enqueued_at")
        return Wrapped.check!(job, &) if Compat.active_job?(job)

        JobOptions.check_payload!(job_class.to_s, job, Options::KNOWN_HASH_KEYS)
        options = Options.resolve(job_class, job)
        if options
          return nil if EnqueueCheck.drop?(options, job["args"], door: :sidekiq, queue:)

          Producer.stamp(job)
        else
          Options.warn_keyless(job_class, job)
        end
        yield
      end
    end
  end
end
