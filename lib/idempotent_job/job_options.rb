# frozen_string_literal: true

module IdempotentJob
  # The resolved idempotency options of one job class (or one plain-API job type):
  # validated once, frozen, and cached per class and option values by {.cached}, so a
  # delivery does no option work beyond looking its options up.
  #
  # Option names are given without a prefix (`lease`, `on_stale`…); `prefix:` only
  # names them in error messages as the door spells them (`idempotency_lease` for the
  # door that reads `sidekiq_options`). A nil value means "not set": the default of
  # {IdempotentJob.configuration} (or the core's default).
  #
  # The options, their kinds, allowed values, limits and defaults are the core's table
  # ({TABLE}, crates/core/src/options/); every value is checked by the core
  # (`Native.job_option`), so the Ruby doors, the Python package and the core agree.
  class JobOptions
    # Answers a lookup may give (the core's `LookupAnswer::NAMES`, which parses them).
    LOOKUP_ANSWERS = Native::LOOKUP_ANSWERS.map(&:to_sym).freeze
    # The core's table of job options ({Configuration::JOB_OPTIONS}).
    TABLE = Configuration::JOB_OPTIONS
    # Option names, without a prefix, in the table's order.
    NAMES = TABLE.keys.freeze
    # Options the Ruby side checks itself: the key declaration ({Key}) and the lookup
    # (a method of the job class or a callable).
    HOST_CHECKED = %i[key lookup].freeze
    # How a payload, `sidekiq_options` and messages spell an option (`idempotency_lease`).
    PREFIX = "idempotency_"
    # The option names as a payload spells them, in {NAMES} order (`idempotency_lease`).
    PAYLOAD_NAMES = NAMES.map { |name| "#{PREFIX}#{name}" }.freeze
    # Shortest lease accepted, in seconds ({Configuration::MIN_LEASE}).
    MIN_LEASE = Configuration::MIN_LEASE
    # Most option sets cached per configuration (per-push overrides add entries).
    CACHE_LIMIT = 1000

    # One class's last resolution ({.resolve}): the option values it was built from, the
    # prefix, the settings (by identity) and the options (nil: not an idempotent job).
    Memo = Struct.new(:read, :prefix, :config, :options)

    @cache = {}
    @cache_config = nil
    @cache_lock = Mutex.new
    @memo = {}
    @memo_lock = Mutex.new

    class << self
      # The options a door reads for one delivery of a job class: resolved and validated
      # once per class and values ({.cached}); the last resolution of each class is
      # remembered with the values it was built from and the settings, so the next
      # delivery of that class compares one Array instead of building and looking up a Hash.
      # @param job_class [Class, String] the job class (or its name if not loadable)
      # @param values [Array] the option values in {NAMES} order (nil: not set)
      # @param prefix [String] how the door spells option names, for messages
      # @return [JobOptions, nil] nil when no key is declared (the job passes through)
      # @raise [OperationKeyError] for a malformed key declaration
      # @raise [ConfigurationError] for a bad lease, scope, policy, heartbeat or lookup
      def resolve(job_class, values, prefix: "")
        config = IdempotentJob.configuration
        memo = @memo[job_class]
        return memo.options if memo&.config.equal?(config) && memo.prefix == prefix && memo.read == values

        given = NAMES.zip(values).to_h.compact
        options = given.key?(:key) ? cached(job_class, given, prefix:) : nil
        memo = Memo.new(values.freeze, prefix, config, options).freeze
        @memo_lock.synchronize { @memo = @memo.merge(job_class => memo) }
        options
      end

      # The options of `job_class` with these values, built once and then cached
      # (until {IdempotentJob.configure} replaces the settings).
      # @param job_class [Class, String] the job class (its `perform` names key parameters,
      #   its methods answer a lookup), or a job type name
      # @param values [Hash{Symbol => Object}] option values by {NAMES} (nil: default)
      # @param prefix [String] how the door spells option names, for messages
      # @return [JobOptions]
      # @raise [OperationKeyError] for a malformed key declaration
      # @raise [ConfigurationError] for a bad option value
      def cached(job_class, values, prefix: "")
        config = IdempotentJob.configuration
        cache_key = [job_class, values, prefix]
        @cache_lock.synchronize do
          @cache = {} unless @cache_config.equal?(config) && @cache.size < CACHE_LIMIT
          @cache_config = config
          found = @cache[cache_key]
          return found if found
        end
        built = new(job_class, values, prefix:, config:)
        # Kept only if the settings it was built with are still the cache's (configure
        # may have replaced them while it was built).
        @cache_lock.synchronize { @cache[cache_key] = built if @cache_config.equal?(config) }
        built
      end

      # Refuses option names the core does not know.
      # @param job_name [String] the job, for the message
      # @param names [Enumerable<Symbol, String>] option names without a prefix
      # @param prefix [String] how the door spells option names, for the message
      # @return [void]
      # @raise [ConfigurationError] naming the job, the first unknown option as written,
      #   the nearest known one ("did you mean") and every known one
      def check_names!(job_name, names, prefix: "")
        names.each do |name|
          Native.job_option(job_name.to_s, prefix, name.to_s, nil) unless TABLE.key?(name.to_sym)
        end
      end

      # Checks the options a job class declares, where it declares them (`sidekiq_options`,
      # ActiveJob's `idempotency`), the same way for both Ruby doors: every name, every value
      # given but the lookup's (a method may be defined further down: checked at first use),
      # and the key declaration's shape, its parameter names too unless `shape_only`. Options
      # left unset are not read here: the configured defaults ({IdempotentJob.configure})
      # apply at the first push or delivery, so they may be set after the classes load.
      # @param job_class [Class] the declaring class
      # @param values [Hash{Symbol, String => Object}] the declared values by option name as
      #   the door spells it (a key without the prefix is not the gem's: skipped)
      # @param prefix [String] how the door spells option names (`idempotency_` for Sidekiq)
      # @param shape_only [Boolean] `perform` is not defined yet: the key's parameter names
      #   are checked later (at first use, or when the door sees `perform` defined)
      # @return [void]
      # @raise [ConfigurationError] naming the job, the option and the known ones, or the bad value
      # @raise [OperationKeyError] for a malformed key declaration
      def check_declaration!(job_class, values, prefix: "", shape_only: !job_class.method_defined?(:perform))
        values.each do |name, value|
          next unless name.to_s.start_with?(prefix)

          name = name.to_s.delete_prefix(prefix)
          Native.job_option(job_class.name.to_s, prefix, name, HOST_CHECKED.include?(name.to_sym) ? nil : value)
          Key.new(job_class, value, shape_only:) if name == "key" && !value.nil?
        end
      end

      # Refuses a {PREFIX}ed key of a payload (a Sidekiq job hash, a serialized ActiveJob
      # job) that names no option and is not one the gem writes itself: a misspelled
      # option is an error, not a default silently applied. A scan of the payload's keys.
      # @param job_name [String] the job, for the message
      # @param payload [Hash] the payload
      # @param carried [#include?] the prefixed keys the door takes as they are
      # @yieldparam key [String] a prefixed key naming an option (the door decides whether
      #   its payloads may carry one)
      # @return [void]
      # @raise [ConfigurationError] naming the job, the key as written, the nearest option and every option
      def check_payload!(job_name, payload, carried)
        payload.each_key do |key|
          next if !key.is_a?(String) || !key.start_with?(PREFIX) || carried.include?(key)

          check_names!(job_name, [key.delete_prefix(PREFIX)], prefix: PREFIX)
          yield key if block_given?
        end
      end
    end

    # @return [String] the job's name in messages (the class name)
    attr_reader :name
    # @return [Key, nil] the resolved key declaration (nil: the door gives the operation key)
    attr_reader :key
    # @return [String] the job type stored in the record (`scope`, default the name)
    attr_reader :scope
    # @return [Numeric] lease in seconds
    attr_reader :lease
    # @return [Symbol] :reclaim, :hold or :skip
    attr_reader :on_stale
    # @return [Symbol] :log or :raise
    attr_reader :on_mismatch
    # @return [Symbol, #call, nil] the host's method (or a callable taking the operation
    #   key) asked about a stale claim
    attr_reader :lookup
    # @return [Boolean] renew the lease while the body runs
    attr_reader :heartbeat
    # @return [Numeric] seconds after which renewing stops
    attr_reader :max_run
    # @return [Symbol, nil] :native, :active_record, or nil (not transactional)
    attr_reader :transaction
    # @return [Numeric] seconds a transactional claim waits for another delivery
    attr_reader :lock_timeout
    # @return [Boolean] store the body's return value as JSON with the completion, so a
    #   repeat replays it (default false)
    attr_reader :store_result
    # @return [Symbol] :push (default) or :skip_completed: drop a producer's push of a
    #   completed operation ({EnqueueCheck})
    attr_reader :on_enqueue
    # @return [Integer, nil] the reclaim budget: after this many stale takeovers of one
    #   operation the next is held for a person instead of reclaimed (nil: no budget)
    attr_reader :max_takeovers

    # Use {.cached} in a door; `new` validates every time.
    # @param job_class [Class, String]
    # @param values [Hash{Symbol => Object}] by {NAMES}
    # @param prefix [String] option name prefix for messages
    # @param config [Configuration] the defaults
    # @raise [OperationKeyError, ConfigurationError]
    def initialize(job_class, values, prefix: "", config: IdempotentJob.configuration)
      @job_class = job_class
      @values = values.transform_keys(&:to_sym)
      @prefix = prefix
      @name = job_class.is_a?(Class) ? job_class.name.to_s : job_class.to_s
      self.class.check_names!(@name, @values.keys, prefix:)

      @key = @values[:key].nil? ? nil : Key.for(job_class, @values[:key])
      TABLE.each do |name, spec|
        instance_variable_set(:"@#{name}", resolve(name, spec, config)) unless HOST_CHECKED.include?(name)
      end
      @lookup = resolve_lookup(@values[:lookup])
      freeze
    end

    # @return [String] the lookup's name in messages ("lookup #find_charge", "lookup")
    def lookup_label
      @lookup.is_a?(Symbol) ? "lookup ##{@lookup}" : "lookup"
    end

    # The operation key of a producer's arguments, checked by the core's rules at
    # enqueue ({Key.check!}); a worker's delivery is checked by its one native call.
    # @param args [Array] the job's arguments (ActiveJob's with GlobalIDs as their URIs)
    # @return [String]
    # @raise [OperationKeyError] naming the job and the problem
    def checked_key(args)
      key = @key.operation_key(args, job_type: @scope)
      Key.check!(@scope, key, job_name: @name, declaration: @key.declaration)
    end

    # The options as the core reads them (`JobOptions::from_settings`, through
    # `Native::Protocol.new`): every option of the table by name with its checked value,
    # but the key (the door's) and the lookup, given as its label (nil: none).
    # @return [Hash{Symbol => Object}]
    def settings
      (NAMES - HOST_CHECKED).to_h { |name| [name, instance_variable_get(:"@#{name}")] }
                            .merge(lookup: @lookup && lookup_label)
    end

    private

    def label(name)
      "#{@prefix}#{name}"
    end

    # The value given, else the setting's (or the core's) default, checked and
    # normalised by the core.
    def resolve(name, spec, config)
      value = @values[name]
      if value.nil?
        value = if spec[:setting] then config.public_send(spec[:setting])
                elsif spec[:default_is_job_name] then @name
                else
                  spec[:default]
                end
      end
      Native.job_option(@name, @prefix, name.to_s, value)
    end

    def resolve_lookup(value)
      return nil if value.nil?
      return value if value.respond_to?(:call)

      unless value.is_a?(Symbol) || (value.is_a?(String) && !value.empty?)
        raise ConfigurationError, "#{@name}: #{label(:lookup)} must be a method name (Symbol or String) or a " \
                                  "callable, got #{value.inspect}"
      end

      name = value.to_sym
      return name unless @job_class.is_a?(Class) && !@job_class.method_defined?(name)

      raise ConfigurationError, "#{@name}: #{label(:lookup)} names ##{name}, which #{@name} does not define"
    end
  end
end
