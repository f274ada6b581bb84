# frozen_string_literal: true

require "sidekiq"
require "idempotent_job"

module IdempotentJob
  # Sidekiq integration: `require "idempotent_job/sidekiq"` adds {ServerMiddleware} to
  # the server chain and {ClientMiddleware} to the client chains. Written against the
  # middleware API shared by Sidekiq 6.4 to 8.x (plain classes with `call`).
  module Sidekiq
    # The idempotency options of one job, read from the job hash (where Sidekiq merges
    # `sidekiq_options` at enqueue, and `set(...)` overrides) and then from the class.
    class Options
      # @return [String] the job type stored in the record
      attr_reader :scope
      # @return [Numeric] lease in seconds
      attr_reader :lease
      # @return [IdempotentJob::Key] the resolved key declaration
      attr_reader :key

      # @param job_class [Class, String] the job class (or its name if not loadable)
      # @param job_hash [Hash] Sidekiq's job payload
      # @return [Options, nil] nil for jobs without `idempotency_key` (passed through)
      # @raise [OperationKeyError] for a malformed key declaration
      # @raise [ConfigurationError] for a bad lease or scope
      def self.resolve(job_class, job_hash)
        declaration = option(job_class, job_hash, "idempotency_key")
        declaration.nil? ? nil : new(job_class, job_hash, declaration)
      end

      # @return [Object, nil] the option from the job hash, else from the class
      def self.option(job_class, job_hash, name)
        return job_hash[name] if job_hash.key?(name)
        return nil unless job_class.respond_to?(:get_sidekiq_options)

        job_class.get_sidekiq_options[name]
      end

      def initialize(job_class, job_hash, declaration)
        name = job_class.is_a?(Class) ? job_class.name : job_class.to_s
        @key = Key.for(job_class, declaration)
        lease = self.class.option(job_class, job_hash, "idempotency_lease") || IdempotentJob.configuration.lease
        @lease = Configuration.positive_seconds!("idempotency_lease", lease, job: name)
        @scope = (self.class.option(job_class, job_hash, "idempotency_scope") || name).to_s
        raise ConfigurationError, "#{name}: idempotency_scope must not be empty" if @scope.empty?
      end
    end

    # Server middleware: claims the operation before the job body runs.
    #
    # For each delivery of a job that declares `idempotency_key`, one statement decides:
    # * first delivery (or a retry after the body raised, or a takeover of a stale claim):
    #   run the body, then mark the record completed;
    # * already completed: do not run; the record's `duplicates` is counted;
    # * claimed by another delivery whose lease is live: do not run now; the delivery is
    #   pushed back to arrive when that lease ends, so it is never lost.
    # If the body raises, the claim is released and the exception re-raised (Sidekiq's
    # retry runs it again), except on Sidekiq::Shutdown, where the claim is kept for the
    # lease to decide. Reads and writes `idempotent_job_records`.
    class ServerMiddleware
      # Longest error text stored in `last_error`.
      ERROR_TEXT_LIMIT = 1000
      # Seconds to wait before each new attempt to record a completion after a
      # connection error (the body has run: its completion is worth a short wait).
      COMPLETION_RETRY_DELAYS = [0.05, 0.25, 1.0].freeze

      # @param job_instance [Object] the job object Sidekiq built
      # @param job_hash [Hash] the job payload ("class", "args", "jid", options…)
      # @param _queue [String] queue name
      # @yield runs the rest of the chain and the job body
      # @return [Object] the block's value, or nil when the delivery was skipped or deferred
      # @raise [OperationKeyError] when the arguments yield no operation key (body not run)
      # @raise [ConnectionError, DatabaseError] when the claim cannot be decided (body not run)
      # @raise [LostClaimError] when the body ran but its claim had been taken over
      def call(job_instance, job_hash, _queue, &)
        options = Options.resolve(job_instance.class, job_hash)
        return yield unless options

        key = options.key.operation_key(job_hash["args"])
        decision = IdempotentJob.store.claim(options.scope, key, job_hash["jid"], options.lease.to_f)
        case decision[:decision]
        when :claimed then run_claimed(options.scope, key, job_hash, decision, &)
        when :completed then skip(options.scope, key, job_hash, decision)
        else defer(options.scope, key, job_hash, decision)
        end
      end

      private

      def logger
        IdempotentJob.logger
      end

      def describe(scope, key, job_hash)
        "#{scope} operation #{key.inspect} (jid #{job_hash["jid"]})"
      end

      def run_claimed(scope, key, job_hash, decision)
        log_claim(scope, key, job_hash, decision)
        token = decision[:token]
        begin
          result = yield
        rescue Exception => e # rubocop:disable Lint/RescueException -- re-raised; the claim must not stay held
          release(scope, key, job_hash, token, e)
          raise
        end
        complete(scope, key, job_hash, token)
        result
      end

      # Records the completion, retrying briefly on connection errors. If it still cannot
      # be written, the body's success stands (no retry that would repeat the effect):
      # the record stays claimed, and its lease decides what a later delivery does.
      def complete(scope, key, job_hash, token)
        failures = 0
        begin
          IdempotentJob.store.complete(scope, key, token)
        rescue IdempotentJob::ConnectionError => e
          delay = COMPLETION_RETRY_DELAYS[failures]
          failures += 1
          if delay
            sleep(delay)
            retry
          end
          logger.error("idempotent_job: #{describe(scope, key, job_hash)} ran, but its completion could not " \
                       "be recorded after #{failures} attempts (#{e.message}); the record stays claimed until " \
                       "its lease ends, after which a redelivery would run it again")
        end
      end

      def log_claim(scope, key, job_hash, decision)
        case decision[:kind]
        when :takeover
          logger.warn("idempotent_job: took over the stale claim of #{describe(scope, key, job_hash)}, " \
                      "attempt #{decision[:attempt]}: its holder's lease ran out, the job runs again " \
                      "(if the holder had done the effect, this is a duplicate)")
        when :retry
          logger.info("idempotent_job: claimed #{describe(scope, key, job_hash)} again after a failure, " \
                      "attempt #{decision[:attempt]}")
        end
      end

      def release(scope, key, job_hash, token, error)
        if shutdown?(error)
          logger.warn("idempotent_job: Sidekiq is shutting down: the claim of #{describe(scope, key, job_hash)} " \
                      "is kept until its lease ends")
          return
        end
        text = "#{error.class}: #{error.message}"[0, ERROR_TEXT_LIMIT]
        IdempotentJob.store.release(scope, key, token, text)
      rescue IdempotentJob::Error => e
        logger.error("idempotent_job: could not release the claim of #{describe(scope, key, job_hash)} " \
                     "(#{e.class}: #{e.message}); it stays claimed until its lease ends")
      end

      def shutdown?(error)
        return false unless defined?(::Sidekiq::Shutdown)

        seen = []
        while error && !seen.include?(error)
          return true if error.is_a?(::Sidekiq::Shutdown)

          seen << error
          error = error.cause
        end
        false
      end

      def skip(scope, key, job_hash, decision)
        logger.info("idempotent_job: #{describe(scope, key, job_hash)} already completed; " \
                    "duplicate delivery skipped (#{decision[:duplicates]} so far)")
        nil
      end

      def defer(scope, key, job_hash, decision)
        delay = decision[:lease_remaining] + IdempotentJob.configuration.defer_margin
        if defined?(::Sidekiq::Testing) && ::Sidekiq::Testing.inline?
          raise IdempotentJob::Error, "#{describe(scope, key, job_hash)} is in progress under jid " \
                                      "#{decision[:holder_jid]}; inline testing cannot defer it"
        end
        deferrals = job_hash.fetch("idempotency_deferrals", 0) + 1
        ::Sidekiq::Client.push(job_hash.merge("at" => Time.now.to_f + delay, "idempotency_deferrals" => deferrals))
        logger.info("idempotent_job: #{describe(scope, key, job_hash)} is in progress under jid " \
                    "#{decision[:holder_jid]}; delivery deferred by #{delay.round(1)} s, until its lease ends")
        nil
      end
    end

    # Client middleware: checks at enqueue time that a job's arguments yield an
    # operation key, so a bad declaration or a missing argument fails in the caller of
    # `perform_async` rather than in the worker. Touches no database.
    class ClientMiddleware
      # @param job_class [Class, String] the job class or its name
      # @param job [Hash] the job payload
      # @param _queue [String]
      # @param _redis_pool [ConnectionPool, nil]
      # @yield pushes the job
      # @raise [OperationKeyError, ConfigurationError] when the job would fail its claim
      def call(job_class, job, _queue, _redis_pool = nil)
        klass = job_class.is_a?(Class) ? job_class : constantize(job_class.to_s)
        # A producer that does not load the job class cannot resolve parameter names:
        # the worker checks the key before the body runs.
        Options.resolve(klass, job)&.key&.operation_key(job["args"]) if klass
        yield
      end

      private

      def constantize(name)
        Object.const_get(name)
      rescue NameError
        nil
      end
    end

    # Adds the middleware to Sidekiq's chains (called when this file is required).
    # @return [void]
    def self.install!
      ::Sidekiq.configure_server do |config|
        config.server_middleware { |chain| chain.add(ServerMiddleware) }
        config.client_middleware { |chain| chain.add(ClientMiddleware) }
      end
      ::Sidekiq.configure_client do |config|
        config.client_middleware { |chain| chain.add(ClientMiddleware) }
      end
    end
  end
end

IdempotentJob::Sidekiq.install!
