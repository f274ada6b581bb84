# frozen_string_literal: true

module IdempotentJob
  # How the facade builds, reports on and retires its native store (one per
  # configuration). Internal: used by {IdempotentJob.configure}, {IdempotentJob.reset!},
  # {IdempotentJob.store} and {IdempotentJob.settle_repeats}.
  module StoreLifecycle
    @announced_url = nil
    @dropped_reported = ObjectSpace::WeakMap.new
    @database_fallback = nil

    class << self
      # Where the store's database comes from when the settings name none (no
      # database_url, IDEMPOTENT_JOB_DATABASE_URL or DATABASE_URL, no host, port, dbname,
      # user or password): nil (then the core says what to set), or a callable taking
      # the {Configuration} and returning connection settings (Hash, or nil for none).
      # The Railtie sets it to {RailsDatabase.fallback} (database.yml's primary database).
      # @return [#call, nil]
      attr_accessor :database_fallback

      # Builds the native store of `config` (its pool is made on first use) and logs,
      # once per URL, the URL parameters it ignores. When `config` names no database,
      # {database_fallback}'s settings fill in its unset connection settings (on a copy:
      # `config` is left as it is, so a later explicit setting replaces them whole).
      # @param config [Configuration]
      # @return [IdempotentJob::Native::Store]
      # @raise [ConfigurationError] when the settings are invalid
      def build(config)
        config = with_fallback(config)
        Native::Store.new(config.to_native_json).tap { announce_ignored_url_params(config) }
      end

      # Logs the repeats `store` dropped since the last report (a batch lost with its
      # connection after it was sent, refused for good, or past the queue's bound; see
      # docs/design.md "Repeat bookkeeping: what a crash can lose").
      # @param store [IdempotentJob::Native::Store]
      # @param logger [Logger, nil]
      # @return [void]
      def report_dropped(store, logger)
        dropped = store.repeats_dropped
        reported = @dropped_reported[store] || 0
        return if dropped <= reported

        @dropped_reported[store] = dropped
        logger&.warn("idempotent_job: #{dropped - reported} repeat counts dropped instead of written " \
                     "(the repeats report undercounts them; #{dropped} since this pool was built)")
      end

      # Writes what a store being replaced still has queued for the repeats report, then
      # closes its pool (its connections and threads) once the calls, transactions and
      # heartbeats in flight on it are done, instead of at the next garbage collection.
      # @param store [IdempotentJob::Native::Store, nil] the replaced store (nil: none built)
      # @param logger [Logger, nil]
      # @return [void]
      def retire(store, logger)
        return unless store

        begin
          store.settle_repeats
        rescue Error => e
          logger&.warn("idempotent_job: repeat bookkeeping of the replaced pool not written (#{e.message})")
        end
        report_dropped(store, logger)
        store.close
      end

      private

      def with_fallback(config)
        return config if database_fallback.nil? || config.database_named?

        settings = database_fallback.call(config)
        settings ? config.with_unset(settings).validate! : config
      end

      # One log line per URL naming the parameters Rails or libpq know but the gem's own
      # connections have no use for (`encoding`, `reconnect`, `variables[…]`…).
      def announce_ignored_url_params(config)
        ignored = config.url_params[:ignored]
        return if ignored.nil? || ignored.empty? || @announced_url == config.database_url

        @announced_url = config.database_url
        config.logger.info("idempotent_job: database_url parameters ignored (Rails' or libpq's, of no use to " \
                           "the gem's own connections): #{ignored.join(", ")}")
      end
    end
  end
end
