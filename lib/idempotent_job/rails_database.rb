# frozen_string_literal: true

module IdempotentJob
  # A Rails app's database as ActiveRecord configures it (config/database.yml, or
  # `ActiveRecord::Base.configurations` once ActiveRecord is loaded), in the gem's
  # connection settings. The Railtie falls back to the primary database through
  # {fallback} when nothing names the gem's database; {settings} gives another entry of a
  # multi-database app to {IdempotentJob.configure}. Reads ActiveRecord's configuration
  # and libpq's environment variables; writes nothing.
  module RailsDatabase
    # The adapters whose database the gem can keep its records in.
    ADAPTERS = %w[postgresql postgis].freeze

    # database.yml's name of a field => the gem's setting (libpq's name).
    FIELDS = { host: :host, port: :port, database: :dbname, username: :user, password: :password,
               sslmode: :sslmode, sslrootcert: :sslrootcert, sslcert: :sslcert, sslkey: :sslkey }.freeze

    # libpq's environment variable for each setting: what libpq, and so ActiveRecord,
    # uses for a field database.yml leaves out.
    LIBPQ_ENV = { host: "PGHOST", port: "PGPORT", dbname: "PGDATABASE", user: "PGUSER", password: "PGPASSWORD",
                  sslmode: "PGSSLMODE", sslrootcert: "PGSSLROOTCERT", sslcert: "PGSSLCERT",
                  sslkey: "PGSSLKEY" }.freeze

    # libpq's default Unix-socket directories, for an entry without host (nor PGHOST):
    # Debian's and Ubuntu's build, then PostgreSQL's own.
    SOCKET_DIRECTORIES = %w[/var/run/postgresql /tmp].freeze

    # A port as libpq reads it (strtol in base 10 between C spaces): decimal digits,
    # optionally signed, optionally between spaces; "5_432", "5432.0" or "0x1538" are none.
    LIBPQ_PORT = /\A[ \t\n\v\f\r]*([+-]?[0-9]+)[ \t\n\v\f\r]*\z/

    class << self
      # The gem's settings for an entry of ActiveRecord's configuration.
      # @param name [String] the entry ("primary", or another database of a
      #   multi-database app, e.g. "queue")
      # @param env [String] the Rails environment (default `Rails.env`)
      # @return [Hash{Symbol => Object}] for {IdempotentJob.configure}: database_url (for
      #   a `url:` entry) and host, port (Integer), dbname, user, password, sslmode,
      #   sslrootcert, sslcert, sslkey as given (else libpq's environment variables; a
      #   missing host is libpq's default Unix-socket directory)
      # @raise [ConfigurationError] when there is no such entry, its adapter is not
      #   postgresql or postgis, or its port (or PGPORT) is no port libpq reads
      def settings(name = "primary", env: ::Rails.env.to_s)
        db_config = entry(name, env)
        unless db_config
          raise ConfigurationError, "config/database.yml has no #{name.inspect} database for the #{env} " \
                                    "environment: name one it has, or set database_url"
        end

        translate(db_config, name, env)
      end

      # What the Railtie gives the store when the configuration names no database (no
      # database_url, IDEMPOTENT_JOB_DATABASE_URL, DATABASE_URL, nor host, port, dbname,
      # user, password): the primary database of the current environment, logged at info
      # on `config.logger`.
      # @param config [Configuration] the settings the store is built from
      # @return [Hash{Symbol => Object}, nil] {settings} of the primary entry; nil when
      #   ActiveRecord is not loaded or configures no database for this environment
      # @raise [ConfigurationError] when its adapter is not postgresql or postgis, or its
      #   port (or PGPORT) is no port libpq reads
      def fallback(config)
        env = ::Rails.env.to_s
        db_config = entry("primary", env)
        return unless db_config

        translate(db_config, "primary", env).tap do |found|
          config.logger.info("idempotent_job: database from config/database.yml (ActiveRecord's primary " \
                             "configuration for #{env}): #{describe(found)}; an explicit database_url or " \
                             "host setting would win")
        end
      end

      private

      # The entry `name` of `env`, or (for "primary") the environment's first entry,
      # as Rails takes it; nil without ActiveRecord or without such an entry.
      def entry(name, env)
        configurations = active_record_configurations or return
        configs = configurations.configs_for(env_name: env)
        configs.find { |c| c.name == name } || (name == "primary" ? configs.first : nil)
      end

      # ActiveRecord::Base's configurations once loaded (the app may have set them);
      # before that, database.yml's as ActiveRecord's Railtie reads them, without
      # loading ActiveRecord::Base (which would load its adapter's library).
      def active_record_configurations
        return unless defined?(::ActiveRecord::DatabaseConfigurations)
        return ::ActiveRecord::Base.configurations if ::ActiveRecord.autoload?(:Base).nil?

        app = defined?(::Rails.application) && ::Rails.application
        return unless app && (app.config.paths["config/database"].existent.first || ENV.fetch("DATABASE_URL", nil))

        ::ActiveRecord::DatabaseConfigurations.new(app.config.database_configuration)
      end

      def translate(db_config, name, env)
        check_adapter!(db_config.adapter.to_s, name, env)
        found = fields(db_config.configuration_hash, "config/database.yml's #{name} database for #{env}")
        found[:database_url] = db_config.url if db_config.respond_to?(:url)
        found.reject { |_, value| blank?(value) }
      end

      def check_adapter!(adapter, name, env)
        return if ADAPTERS.include?(adapter)

        raise ConfigurationError, "config/database.yml's #{name} database for #{env} uses the adapter " \
                                  "#{adapter.inspect}: idempotent_job keeps its records in PostgreSQL (adapter " \
                                  "postgresql or postgis); set database_url (config.idempotent_job.database_url " \
                                  "or IDEMPOTENT_JOB_DATABASE_URL) to a PostgreSQL database"
      end

      # The entry's fields by the gem's names, else libpq's environment variables; the
      # port as an Integer, read as libpq reads it ({port}); no host: libpq's default
      # socket directory. `entry` names the entry in errors.
      def fields(hash, entry)
        found = FIELDS.to_h { |yml, setting| [setting, hash[yml]] }
        from_env = LIBPQ_ENV.filter_map do |setting, var|
          next unless blank?(found[setting])

          found[setting] = ENV.fetch(var, nil)
          setting
        end
        found.transform_values! { |value| value.is_a?(Symbol) ? value.to_s : value }
        if found[:port].is_a?(String) && !blank?(found[:port])
          found[:port] = port(found[:port], from_env.include?(:port), entry)
        end
        found[:host] = default_socket_directory(found[:port]) if blank?(found[:host])
        found
      end

      # A port given as text, as libpq reads it ({LIBPQ_PORT}: decimal, so "05432" is
      # 5432, never octal); the range is the port setting's rule, checked by the core.
      # Anything else libpq refuses, so ActiveRecord could not connect either: refused
      # here naming the entry (or PGPORT, when the entry gives no port).
      def port(text, from_env, entry)
        digits = LIBPQ_PORT.match(text)
        return Integer(digits[1], 10) if digits

        whose = from_env ? "PGPORT (libpq's port for #{entry}, which gives none) is" : "#{entry} has port"
        raise ConfigurationError, "#{whose} #{text.inspect}: not a port as libpq reads it (decimal digits, such as " \
                                  "5432); libpq, and so ActiveRecord, refuses it too"
      end

      # libpq's default directory: the first holding the server's socket, else Debian's.
      def default_socket_directory(port)
        SOCKET_DIRECTORIES.find { |dir| File.exist?(File.join(dir, ".s.PGSQL.#{port || 5432}")) } ||
          SOCKET_DIRECTORIES.first
      end

      def describe(found)
        found.slice(:host, :port, :dbname, :user, :sslmode).map { |k, v| "#{k} #{v}" }
             .push(found[:database_url] && "url #{Configuration.redact(found[:database_url])}").compact.join(", ")
      end

      def blank?(value)
        value.nil? || (value.respond_to?(:empty?) && value.empty?)
      end
    end
  end
end
