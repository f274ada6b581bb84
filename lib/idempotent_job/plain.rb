# frozen_string_literal: true

require "securerandom"

module IdempotentJob
  # The plain Ruby door behind {IdempotentJob.perform_once}: any consumer (an SQS
  # poller, a webhook handler, a rake task) runs a block at most once per operation.
  # It gives the {Protocol} the key as a value and the base {Door}: nothing is
  # deferred for the caller — an :in_progress outcome says when to come back.
  module Plain
    # Options the plain API takes besides `lease:` (the same as a job's, unprefixed; not
    # `on_enqueue:`, which decides a producer's push and perform_once pushes nothing).
    OPTIONS = (JobOptions::NAMES - %i[key scope lease on_enqueue]).freeze
    # Every keyword perform_once takes, for the message naming one it does not take.
    TAKES = (%i[lease payload id deferrals facts job_class queue wait] + OPTIONS).freeze
    # Job types whose value-key rules are kept (a {Key} per job type, parsed once).
    KEYS_LIMIT = 1000
    @keys = {}

    # The operation key of a value given directly, by the {Key} of `type` (built once).
    # @param type [String] the job type
    # @param value [String, Symbol, Integer, Hash, Array]
    # @return [String]
    # @raise [OperationKeyError] as {Key.value_key}
    def self.value_key(type, value)
      key = @keys[type] ||= begin
        @keys = {} if @keys.size >= KEYS_LIMIT
        Key.new(type, 0, direct: true)
      end
      key.operation_key([value])
    end

    # See {IdempotentJob.perform_once}.
    # @return [Outcome]
    def self.perform_once(job_type, # rubocop:disable Metrics/ParameterLists -- the public API, keywords
                          operation_key, lease: nil, payload: [], id: nil, deferrals: 0, facts: {},
                          job_class: nil, queue: nil, wait: nil, **options, &block)
      raise ArgumentError, "IdempotentJob.perform_once needs a block" unless block

      type = IdempotentJob.job_type_text(job_type)
      raise ConfigurationError, "perform_once: the job type must not be empty" if type.empty?

      options = JobOptions.cached(type, { lease:, **checked(type, options) })
      facts = checked_facts(type, facts)
      # The key's size and text are checked by the core's one call (Native::Protocol#perform).
      delivery = Delivery.new(job_type: type, operation_key: value_key(type, operation_key), payload:,
                              job_class: job_class || type, queue:, id: id || SecureRandom.uuid, deferrals:, facts:)
      Protocol.new(options, door: Door::PLAIN).run(delivery, wait: checked_wait(type, wait, options), &block)
    end

    # `wait:` in seconds (nil: no wait), checked by the core's rule ({Native.check_wait}:
    # 0 to ten years), never with a transaction (a transactional claim waits on the row
    # lock instead).
    def self.checked_wait(type, wait, options)
      return nil if wait.nil?

      wait = Native.check_wait(type, wait)

      if options.transaction
        raise ConfigurationError, "#{type}: perform_once's wait: cannot be combined with transaction: (a " \
                                  "transactional claim already waits for the other delivery's transaction, " \
                                  "up to lock_timeout)"
      end
      wait
    end
    private_class_method :checked_wait

    # `facts:` as a Hash (nil: none); anything else refused naming the job, before a claim.
    def self.checked_facts(type, facts)
      return {} if facts.nil?
      return facts if facts.is_a?(Hash)

      raise ConfigurationError, "#{type}: perform_once's facts: must be a Hash (what this delivery's queue knows " \
                                "of it, stored with the claim for the repeats report), got " \
                                "#{facts.inspect[0, 100]}; the job was not run and nothing was recorded"
    end
    private_class_method :checked_facts

    # The job options given to perform_once, checked before a claim: on_enqueue: refused,
    # an option it does not take refused by the core's message ({Native.not_taken}, with
    # {TAKES}), lookup: must be callable.
    # @param type [String] the job type, named in the errors
    # @param options [Hash{Symbol => Object}] the keywords besides perform_once's own
    # @return [Hash{Symbol => Object}] the same options
    # @raise [ConfigurationError] naming the job type and the option
    def self.checked(type, options)
      if options.key?(:on_enqueue)
        raise ConfigurationError, "#{type}: perform_once does not take on_enqueue: (it decides whether a " \
                                  "Sidekiq or ActiveJob push of a completed operation is skipped; perform_once " \
                                  "pushes nothing, and never runs the block of a completed operation again)"
      end
      unknown = options.keys - OPTIONS
      if unknown.any?
        Native.not_taken(type, "perform_once", unknown.map(&:inspect).join(", "), unknown.first.to_s,
                         TAKES.map(&:to_s), ":")
      end
      lookup = options[:lookup]
      if lookup && !lookup.respond_to?(:call)
        raise ConfigurationError, "#{type}: perform_once's lookup: must be callable (it gets the operation key " \
                                  "and answers #{Native.lookup_answers_listed(":", "")}), got #{lookup.inspect}"
      end
      options
    end
    private_class_method :checked
  end
end
