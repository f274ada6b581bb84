# frozen_string_literal: true

require_relative "idempotent_job/version"
require_relative "idempotent_job/errors"
require_relative "idempotent_job/configuration"
require_relative "idempotent_job/key"
require_relative "idempotent_job/record"
require_relative "idempotent_job/native"

# Durable idempotency records in PostgreSQL for at-least-once job queues.
#
# A job declares its operation key (`sidekiq_options idempotency_key: :order_id`); the
# Sidekiq middleware (`require "idempotent_job/sidekiq"`) claims the operation before the
# body runs and records its completion, so a repeated delivery of the same operation
# does not run the body again. See README.md.
module IdempotentJob
  @lock = Mutex.new

  class << self
    # @return [Configuration] the current settings
    def configuration
      @lock.synchronize { @configuration ||= Configuration.new }
    end

    # Changes the settings; the connection pool is rebuilt on next use.
    # @yieldparam config [Configuration]
    # @return [Configuration]
    # @raise [ConfigurationError] when the resulting settings are invalid (checked
    #   without connecting; a missing database_url is reported at first use)
    def configure
      config = configuration
      yield config
      build_store(config) if config.database_url
      @lock.synchronize { @store = nil }
      config
    end

    # Forgets all settings and the connection pool (tests).
    # @return [void]
    def reset!
      @lock.synchronize do
        @configuration = nil
        @store = nil
      end
    end

    # Creates or updates the schema: applies each SQL file of `migrations/` not yet
    # recorded in `idempotent_job_schema_migrations`. Safe to run twice and from
    # several processes at once (an advisory lock serialises them).
    # @return [Array<String>] names of the migrations applied now (empty when up to date)
    # @raise [MigrationError, ConnectionError, ConfigurationError]
    def migrate!
      store.migrate
    end

    # Reads one idempotency record.
    # @param job_type [String, Class] the job type (idempotency_scope; default the class name)
    # @param operation_key [String, Integer] the operation key as stored ("42" for 42)
    # @return [Record, nil] nil when the operation was never claimed
    # @raise [ConnectionError, DatabaseError]
    def record(job_type, operation_key)
      row = store.find(job_type.to_s, operation_key.to_s)
      row && Record.new(**row)
    end

    # @return [String] the SQL of every migration, in order (for teams that manage
    #   migrations with their own tools)
    def schema_sql
      Native.schema_sql
    end

    # @return [String] the one statement that decides a delivery (claim or duplicate)
    def claim_sql
      Native.claim_sql
    end

    # The native store of the current settings, created on first use. Internal.
    # @return [IdempotentJob::Native::Store]
    # @raise [ConfigurationError] when the settings are invalid
    def store
      @lock.synchronize { @store ||= build_store(@configuration ||= Configuration.new) }
    end

    # @return [Logger] where the gem logs its decisions
    def logger
      configuration.logger
    end

    private

    def build_store(config)
      Native::Store.new(config.to_native_json)
    end
  end
end

require_relative "idempotent_job/railtie" if defined?(Rails::Railtie)
