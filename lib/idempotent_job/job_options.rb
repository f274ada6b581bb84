# frozen_string_literal: true

module IdempotentJob
  # The resolved idempotency options of one job class (or one plain-API job type):
  # validated once, frozen, and cached per class and option values by {.cached}, so a
  # delivery does no option work beyond looking its options up.
  #
  # Option names are given without a prefix (`lease`, `on_stale`…); `prefix:` only
  # names them in error messages as the door spells them (`idempotency_lease` for the
  # door that reads `sidekiq_options`). A nil value means "not set": the default of {IdempotentJob.configuration}.
  class JobOptions
    # Answers a lookup may give.
    LOOKUP_ANSWERS = %i[done not_done unknown].freeze
    # Option names, without a prefix.
    NAMES = %i[key scope lease on_stale on_mismatch lookup heartbeat max_run transaction lock_timeout
               store_result on_enqueue].freeze
    # Shortest lease accepted, in seconds ({Configuration::MIN_LEASE}).
    MIN_LEASE = Configuration::MIN_LEASE
    # Most option sets cached per configuration (per-push overrides add entries).
    CACHE_LIMIT = 1000

    @cache = {}
    @cache_config = nil
    @cache_lock = Mutex.new

    class << self
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
      unknown = @values.keys - NAMES
      raise ConfigurationError, "#{@name}: unknown option(s) #{unknown.map { |n| label(n) }.join(", ")}" if
        unknown.any?

      @key = @values[:key].nil? ? nil : Key.for(job_class, @values[:key])
      resolve_basics(config)
      resolve_policies(config)
      freeze
    end

    # @return [String] the lookup's name in messages ("lookup #find_charge", "lookup")
    def lookup_label
      @lookup.is_a?(Symbol) ? "lookup ##{@lookup}" : "lookup"
    end

    private

    def label(name)
      "#{@prefix}#{name}"
    end

    def fetch(name, default)
      value = @values[name]
      value.nil? ? default : value
    end

    def resolve_basics(config)
      @lease = Configuration.positive_seconds!(label(:lease), fetch(:lease, config.lease), job: @name)
      if @lease < MIN_LEASE
        raise ConfigurationError, "#{@name}: #{label(:lease)} must be at least #{MIN_LEASE} s (a shorter lease " \
                                  "cannot be renewed in time), got #{@lease.inspect}"
      end
      @scope = fetch(:scope, @name).to_s
      raise ConfigurationError, "#{@name}: #{label(:scope)} must not be empty" if @scope.empty?

      @max_run = Configuration.positive_seconds!(label(:max_run), fetch(:max_run, config.max_run), job: @name)
      @lock_timeout = Configuration.pg_timeout!(label(:lock_timeout), fetch(:lock_timeout, config.lock_timeout),
                                                job: @name)
    end

    def resolve_policies(config)
      @on_stale = Configuration.choice!(label(:on_stale), fetch(:on_stale, config.on_stale),
                                        Configuration::STALE_POLICIES, job: @name)
      @on_mismatch = Configuration.choice!(label(:on_mismatch), fetch(:on_mismatch, config.on_mismatch),
                                           Configuration::MISMATCH_POLICIES, job: @name)
      @heartbeat = boolean(:heartbeat, fetch(:heartbeat, config.heartbeat))
      @store_result = boolean(:store_result, fetch(:store_result, false))
      @transaction = transaction_flavour(fetch(:transaction, false))
      @lookup = resolve_lookup(@values[:lookup])
      @on_enqueue = Configuration.choice!(label(:on_enqueue), fetch(:on_enqueue, :push), EnqueueCheck::POLICIES,
                                          job: @name)
    end

    # true/false (or "true"/"false", as a per-push override may arrive in JSON).
    def boolean(name, value)
      case value
      when true, "true" then true
      when false, "false" then false
      else raise ConfigurationError, "#{@name}: #{label(name)} must be true or false, got #{value.inspect}"
      end
    end

    def transaction_flavour(value)
      case value
      when true, "true", :native, "native" then :native
      when :active_record, "active_record" then :active_record
      when false, nil, "false" then nil
      else
        raise ConfigurationError, "#{@name}: #{label(:transaction)} must be true, :active_record or false, " \
                                  "got #{value.inspect}"
      end
    end

    def resolve_lookup(value)
      return nil if value.nil?
      return value if value.respond_to?(:call)

      name = value.to_sym
      return name unless @job_class.is_a?(Class) && !@job_class.method_defined?(name)

      raise ConfigurationError, "#{@name}: #{label(:lookup)} names ##{name}, which #{@name} does not define"
    end
  end
end
