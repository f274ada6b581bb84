# frozen_string_literal: true

require "json"
require "logger"

module IdempotentJob
  # Settings of the gem, set once at boot through {IdempotentJob.configure}.
  # Durations are in seconds (Integer or Float).
  #
  # @example
  #   IdempotentJob.configure do |c|
  #     c.database_url = ENV.fetch("DATABASE_URL")
  #     c.lease = 300
  #   end
  class Configuration
    # The core's defaults of the connection settings (crates/core/src/config/settings.rs
    # `connection_defaults_json`), by name: the values below are read from it.
    CORE_DEFAULTS = JSON.parse(Native.connection_defaults_json).freeze

    # The connection settings the gem reads nil as "decide at connection time": pool_size
    # (the URL's `pool`, else the queue's concurrency + the core's headroom, else the
    # core's default: {#effective_pool_size}) and max_result_bytes (the core's default,
    # 65_536).
    UNSET_BY_DEFAULT = %w[pool_size max_result_bytes].freeze

    # Connection settings handed to the native pool, with their defaults: the core's
    # names in its order ({Native.connection_settings}, less database_url) and defaults
    # ({CORE_DEFAULTS}), a choice as a Symbol.
    # Each is checked at assignment by the core's rule ({Native.connection_setting}):
    #
    # - pool_size: pooled connections per process (1 to 262_143); nil: see {#effective_pool_size}
    # - connect_timeout: seconds to establish a connection (up to ten years)
    # - checkout_timeout: seconds to wait for a free pooled connection (up to ten years)
    # - deadline: client-side bound, in seconds, on each call (checkout, connect, the
    #   statement and its retries on fresh connections): past it the connection is
    #   discarded and a retryable TimeoutError raised, even on a network that silently
    #   drops packets (up to PostgreSQL's limit, 2_147_483)
    # - enqueue_check_timeout: seconds the enqueue check (on_enqueue: :skip_completed)
    #   may take before the push goes ahead anyway
    # - statement_timeout: seconds a statement may run (PostgreSQL's statement_timeout,
    #   up to its limit); nil: none
    # - application_name: shown in pg_stat_activity unless the URL sets one
    # - schema: schema of the record table (the connection's search_path); nil: default
    # - host, port, dbname, user, password: discrete connection fields: each overrides
    #   the URL's, and host alone (with the others) replaces a URL
    # - sslmode: TLS (rustls): disable, prefer (default), require, verify-ca, verify-full;
    #   sslrootcert: PEM file of the roots verify-ca/verify-full trust (else the
    #   system's); sslcert, sslkey: PEM client certificate chain and its private key
    # - prepared_statements: send the claim, the fenced changes and the record read as
    #   named prepared statements, prepared once per pooled connection (then one round
    #   trip each, without PostgreSQL parsing and planning them again); false: unnamed
    #   statements, parsed and planned at every call. Set false behind PgBouncer in
    #   transaction mode before 1.21 (or without max_prepared_statements), which cannot
    #   keep named ones.
    # - asynchronous_completion: commit the completion asynchronously (synchronous_commit
    #   off for that one statement): no wait for the WAL flush. RISK: a PostgreSQL crash
    #   within wal_writer_delay (200 ms by default) of a completion can lose it; the
    #   record then stays claimed and, once its lease ends, the stale policy decides
    #   (:reclaim runs the job again). Claims stay durable. Off by default.
    # - max_result_bytes: largest result (bytes of JSON) a completion stores for replays
    #   (store_result; up to jsonb's limit); a larger one is not stored, and the
    #   completion stands. nil: the core's default (65_536).
    # - compatibility: :postgresql, or :distributed for a distributed or pooled server
    #   (CockroachDB, YugabyteDB, Aurora DSQL, RDS Proxy): no named prepared statements,
    #   waits poll instead of LISTEN, migrations take a lock row, not an advisory lock
    #   (docs/scaling.md).
    NATIVE_DEFAULTS = (Native.connection_settings - ["database_url"]).to_h do |name|
      default = UNSET_BY_DEFAULT.include?(name) ? nil : CORE_DEFAULTS.fetch(name)
      [name.to_sym, Native.connection_setting(name, default)] # a choice as a Symbol
    end.freeze

    # Type checks of {#validate!} of the settings that are the gem's alone: setting =>
    # [what it must be, test]. The connection settings are the core's
    # ({Native.connection_setting}).
    VALIDATIONS = {
      logger: ["a Logger", ->(v) { v.nil? || %i[info warn error].all? { |m| v.respond_to?(m) } }]
    }.freeze

    # Every setting {#update} accepts: the connection's, database_url, the core's job
    # default settings ({Native.job_default_settings}: each job option's setting, then
    # defer_margin and retention) and logger.
    SETTINGS = (NATIVE_DEFAULTS.keys + %i[database_url] + Native.job_default_settings.map(&:to_sym) +
                %i[logger]).freeze

    # @return [Numeric] default lease in seconds for every job (override per job with
    #   `idempotency_lease:`). A claim older than its lease is considered stale: its holder
    #   may have died. Default 300.
    attr_reader :lease

    # @return [Numeric] seconds added to the remaining lease when a delivery that found the
    #   operation in progress is pushed back, so it arrives after the lease ends. Default 1
    #   (the core's `DEFAULT_DEFER_MARGIN_SECONDS`, read as `Native::DEFAULT_DEFER_MARGIN`).
    attr_reader :defer_margin

    # The core's table of job options (crates/core/src/options/), read once at load:
    # option name (Symbol, unprefixed) => { kind: "key" | "text" | "seconds" | "choice" |
    # "boolean" | "flavour" | "method", default:, default_is_job_name:, setting: (the
    # setting giving every job its default, or nil), required:, doc:, and by kind
    # allowed: / on: / min:, min_inclusive:, max: }. Frozen. Nothing here restates it.
    JOB_OPTIONS = JSON.parse(Native.job_options_json, symbolize_names: true)
                      .transform_values { |spec| spec.transform_values { |v| v.is_a?(Array) ? v.freeze : v }.freeze }
                      .freeze

    # Shortest lease accepted, in seconds (the core's): below it a heartbeat cannot
    # renew in time (one statement round trip and a thread wake-up) and every delivery
    # looks stale.
    MIN_LEASE = JOB_OPTIONS.fetch(:lease).fetch(:min)

    # Policies for a stale claim (its lease ran out: the holder may have died, before or
    # after its effect), chosen in advance. Override per job with `idempotency_on_stale:`.
    STALE_POLICIES = JOB_OPTIONS.fetch(:on_stale).fetch(:allowed).map(&:to_sym).freeze
    # What a delivery whose arguments differ from the claim's does.
    MISMATCH_POLICIES = JOB_OPTIONS.fetch(:on_mismatch).fetch(:allowed).map(&:to_sym).freeze
    # Settings that give every job an option's default (lease, on_stale, on_mismatch,
    # heartbeat, max_run, lock_timeout), with the core's default of each.
    JOB_DEFAULTS = JOB_OPTIONS.values.select { |spec| spec[:setting] }.to_h do |spec|
      default = spec[:default]
      [spec[:setting].to_sym, spec[:kind] == "choice" ? default.to_sym : default]
    end.freeze

    # @return [Symbol] default stale-claim policy: :reclaim (run again: a rare duplicate),
    #   :hold (do not run; held for a person), :skip (do not run; given up: a rare miss).
    #   Default :reclaim.
    attr_reader :on_stale

    # @return [Symbol] :log (default: report a payload mismatch) or :raise (also refuse
    #   the delivery with PayloadMismatchError)
    attr_reader :on_mismatch

    # @return [Boolean] renew the lease in the background while a job runs (default true)
    attr_reader :heartbeat

    # @return [Numeric] seconds after which the heartbeat stops renewing a job's lease, so
    #   a hung job loses its claim. Default 3600.
    attr_reader :max_run

    # @return [Numeric] seconds a finished (completed or given-up) record is kept before
    #   {IdempotentJob.purge} deletes it. Default 30 days (2_592_000, the core's
    #   `config::DEFAULT_RETENTION_SECONDS`, read as `Native::DEFAULT_RETENTION`).
    attr_reader :retention

    # @return [Numeric] seconds a transactional job waits for another delivery of the
    #   same operation to commit or roll back before LockTimeoutError. Default 5.
    attr_reader :lock_timeout

    # @return [Logger, nil] where decisions are logged; nil means the logger of a loaded
    #   door's queue (the queue library's logger with its door loaded), otherwise a Logger on $stderr.
    attr_writer :logger

    attr_reader(*NATIVE_DEFAULTS.keys)

    # A writer per connection setting (`pool_size=`, `connect_timeout=`, …): checks the
    # value by the core's rule ({Native.connection_setting}) and keeps it (a choice as a
    # Symbol); raises ConfigurationError naming the setting, in the core's words, where
    # the value is assigned.
    NATIVE_DEFAULTS.each_key do |name|
      define_method(:"#{name}=") do |value|
        instance_variable_set(:"@#{name}", Native.connection_setting(name.to_s, value))
      end
    end

    # @param url [String, nil] PostgreSQL URL (`postgres://user:pass@host:port/db`)
    #   or libpq key/value string; nil means IDEMPOTENT_JOB_DATABASE_URL, then DATABASE_URL.
    # @raise [ConfigurationError] for anything else (the core's rule; the value never shown)
    def database_url=(url)
      @database_url = Native.connection_setting("database_url", url)
    end

    # @param value [Boolean] whether the heartbeat renews the lease
    # @raise [ConfigurationError] naming the setting, unless true or false (the core's rule)
    def heartbeat=(value)
      @heartbeat = self.class.job_default!(:heartbeat, value)
    end

    # Every setting at its default: the core's job defaults ({JOB_DEFAULTS}), defer
    # margin (1 s) and retention (30 days), and the connection settings of
    # {NATIVE_DEFAULTS}, each checked by its writer. database_url and logger start nil
    # (the environment's URL; the door's logger).
    def initialize
      @database_url = nil
      @defer_margin = Native::DEFAULT_DEFER_MARGIN # the core's (1 s)
      @logger = nil
      @retention = Native::DEFAULT_RETENTION # the core's (30 days)
      JOB_DEFAULTS.each { |name, value| instance_variable_set(:"@#{name}", value) }
      NATIVE_DEFAULTS.each { |name, value| public_send("#{name}=", value) }
    end

    # @return [String, nil] the configured URL, else the environment's: the first of
    #   IDEMPOTENT_JOB_DATABASE_URL, DATABASE_URL set and not empty (the core's rule,
    #   {Native.env_database_url}, read at each call)
    def database_url
      @database_url || Native.env_database_url
    end

    # @param seconds [Numeric] default lease, at least {MIN_LEASE}
    # @raise [ConfigurationError] when not a number of seconds of at least {MIN_LEASE}
    def lease=(seconds)
      @lease = self.class.job_default!(:lease, seconds)
    end

    # @param policy [Symbol, String] one of {STALE_POLICIES}
    # @raise [ConfigurationError] for any other value
    def on_stale=(policy)
      @on_stale = self.class.job_default!(:on_stale, policy)
    end

    # @param policy [Symbol, String] one of {MISMATCH_POLICIES}
    # @raise [ConfigurationError] for any other value
    def on_mismatch=(policy)
      @on_mismatch = self.class.job_default!(:on_mismatch, policy)
    end

    # @param seconds [Numeric] > 0
    # @raise [ConfigurationError] unless a positive number
    def max_run=(seconds)
      @max_run = self.class.job_default!(:max_run, seconds)
    end

    # @param seconds [Numeric] from 0 (a purge deletes every finished record) to ten
    #   years, the core's rule ({Native.job_default_setting})
    # @raise [ConfigurationError] naming the setting, for any other value (nil too)
    def retention=(seconds)
      @retention = Native.job_default_setting("retention", seconds)
    end

    # @param seconds [Numeric] > 0
    # @raise [ConfigurationError] unless a positive number
    def lock_timeout=(seconds)
      @lock_timeout = self.class.job_default!(:lock_timeout, seconds)
    end

    # @param seconds [Numeric] from 0 to ten years, the core's rule ({Native.job_default_setting})
    # @raise [ConfigurationError] naming the setting, for any other value (nil too)
    def defer_margin=(seconds)
      @defer_margin = Native.job_default_setting("defer_margin", seconds)
    end

    # @return [Logger] the logger decisions go to
    def logger
      @logger || Door.registered.lazy.filter_map(&:host_logger).first || default_logger
    end

    # Sets several settings at once, rejecting unknown ones.
    # @param settings [Hash{Symbol => Object}] e.g. `pool_size: 20, lease: 60`
    # @return [self]
    # @raise [ConfigurationError] naming an unknown setting and the nearest known one (the
    #   core's wording), or from a setter
    def update(**settings)
      settings.each do |name, value|
        Native.unknown_setting(name.inspect, name.to_s, SETTINGS.map(&:to_s)) unless SETTINGS.include?(name.to_sym)
        public_send("#{name}=", value)
      end
      self
    end

    # An assignment to a setting that does not exist (`c.leese = 5` in a configure
    # block) raises the library's error naming it and the nearest known setting, as
    # {#update} does for a keyword; any other unknown method is Ruby's NoMethodError.
    # @raise [ConfigurationError] for `name=` when `name` is not a setting
    def method_missing(method, *args, &)
      name = method.to_s
      return super unless name.end_with?("=") && args.size == 1

      setting = name.delete_suffix("=")
      Native.unknown_setting(setting.inspect, setting, SETTINGS.map(&:to_s))
    end

    # @return [Boolean] false for unknown setters too (they raise ConfigurationError)
    def respond_to_missing?(method, include_private = false)
      super
    end

    # Connection settings that name the database (an explicit one wins over any fallback).
    LOCATION_SETTINGS = %i[host port dbname user password].freeze

    # @return [Boolean] whether these settings name a database: a database_url (the
    #   setting or IDEMPOTENT_JOB_DATABASE_URL / DATABASE_URL), or one of host, port,
    #   dbname, user, password
    def database_named?
      !database_url.nil? || LOCATION_SETTINGS.any? { |name| !public_send(name).nil? }
    end

    # A copy whose unset settings take the values given; set ones are kept.
    # @param settings [Hash{Symbol => Object}] setting => value (e.g. host:, dbname:)
    # @return [Configuration] the copy (this one is unchanged)
    # @raise [ConfigurationError] naming an unknown setting
    def with_unset(settings)
      unset = settings.reject { |name, _| public_send(name) }
      dup.update(**unset)
    end

    # Checks every setting's type and range (again: each writer checks its own): the
    # connection settings and heartbeat by the core's rules, the logger.
    # @return [self]
    # @raise [ConfigurationError] naming the first bad setting
    def validate!
      Native.connection_setting("database_url", @database_url)
      NATIVE_DEFAULTS.each_key { |name| Native.connection_setting(name.to_s, public_send(name)) }
      self.class.job_default!(:heartbeat, heartbeat)
      VALIDATIONS.each { |name, (expected, valid)| check(name, expected, &valid) }
      self
    end

    # The settings for the native pool as JSON. Contains the password: never log it.
    # @return [String]
    def to_native_json
      NATIVE_DEFAULTS.keys.to_h { |name| [name, public_send(name)] }
                     .merge(database_url: database_url.to_s, pool_size: effective_pool_size)
                     .compact.to_json
    end

    # @return [Integer] pool_size; else the URL's own `pool` parameter (a Rails
    #   DATABASE_URL's); else the queue's concurrency + 5 (heartbeats and deferrals
    #   share the pool) when running inside a queue's server whose door is loaded;
    #   else 10 (the core's rule, {Native.pool_size_for})
    def effective_pool_size
      return pool_size if pool_size

      url_pool = url_params[:pool]
      return url_pool if url_pool

      Native.pool_size_for(door_concurrency)
    end

    # What the URL's own query parameters say ({Native.database_url_params}): `pool`,
    # `prepared_statements` and the parameters the gem ignores; empty when there is no
    # URL or it cannot be read (the store's validation then names the problem).
    # @return [Hash{Symbol => Object}]
    def url_params
      url = database_url
      return {} if url.nil? || url.empty?

      Native.database_url_params(url)
    rescue ConfigurationError
      {}
    end

    # @return [String] the settings, with the URL described by its parts (never its
    #   password) and a set password shown as [REDACTED]
    def inspect
      fields = (NATIVE_DEFAULTS.keys - [:password]).map { |name| "#{name}=#{public_send(name).inspect}" }
      fields << "password=[REDACTED]" if password
      "#<#{self.class.name} database_url=#{self.class.redact(database_url).inspect} " \
        "lease=#{lease.inspect} on_stale=#{on_stale.inspect} #{fields.join(" ")}>"
    end
    alias to_s inspect

    # Checks a setting that gives every job an option's default, by the core's table.
    # @param name [Symbol] the setting (and option) name
    # @param value [Object]
    # @return [Object] the value, normalised (a policy as a Symbol)
    # @raise [ConfigurationError] naming the setting, unless the option accepts it; nil
    #   in the core's words ("lease must be set (its default is 300), got nil",
    #   {Native.job_default_setting}), as Python's None
    def self.job_default!(name, value)
      Native.job_default_setting(name.to_s, value) if value.nil?
      Native.job_option("", "", name.to_s, value)
    end

    # @param url [String, nil]
    # @return [String, nil] the URL's user, host, port and database as parsed by the native
    #   layer, never its password or options; "(unparsable)" when it cannot be parsed
    def self.redact(url)
      url && Native.describe_url(url)
    end

    private

    def check(name, expected)
      value = public_send(name)
      return if yield(value)

      raise ConfigurationError, "#{name} must be #{expected}, got #{value.inspect}"
    end

    def door_concurrency
      Door.registered.lazy.filter_map(&:concurrency).first
    end

    def default_logger
      @default_logger ||= Logger.new($stderr) # each line says "idempotent_job: …" itself
    end
  end
end
