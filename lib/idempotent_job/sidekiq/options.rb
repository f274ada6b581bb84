# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # Reads a Sidekiq job's idempotency options: from the job hash (where Sidekiq
    # merges `sidekiq_options` at enqueue, and `set(...)` overrides them per push), else
    # from the class. The values are resolved and validated once per class and values
    # ({JobOptions.cached}); the last resolution of each class is remembered with what
    # it was read from (the class's options object, the job hash's option values, the
    # settings), so the next delivery of that class compares one Array instead of
    # reading each option again.
    module Options
      # Option names in the job hash, by {JobOptions::NAMES}.
      KEYS = JobOptions::NAMES.to_h { |name| [name, "idempotency_#{name}"] }.freeze
      # The job hash keys, in {KEYS} order.
      HASH_KEYS = KEYS.values.freeze
      # Prefix of the option names, for messages.
      PREFIX = "idempotency_"
      # One class's last resolution: the class's sidekiq_options Hash (by identity), the
      # job hash's option values (in {HASH_KEYS} order), the keys absent from the job
      # hash whose value came from the class, the keys present with nil, the settings
      # (by identity), and the options (nil: not an idempotent job).
      Memo = Struct.new(:declared, :given, :absent, :present_nil, :config, :options)

      @memo = {}
      @memo_lock = Mutex.new

      class << self
        # @param job_class [Class, String] the job class (or its name if not loadable)
        # @param job_hash [Hash] Sidekiq's job payload
        # @return [JobOptions, nil] nil for jobs without `idempotency_key` (passed through)
        # @raise [OperationKeyError] for a malformed key declaration
        # @raise [ConfigurationError] for a bad lease, scope, policy, heartbeat or lookup
        def resolve(job_class, job_hash)
          declared = job_class.respond_to?(:get_sidekiq_options) ? job_class.get_sidekiq_options : nil
          given = job_hash.values_at(*HASH_KEYS)
          config = IdempotentJob.configuration
          memo = @memo[job_class]
          return memo.options if memo && same?(memo, declared, given, config, job_hash)

          options = build(job_class, job_hash, declared)
          remember(job_class, job_hash, Memo.new(declared, given.freeze, nil, nil, config, options))
          options
        end

        private

        def same?(memo, declared, given, config, job_hash)
          memo.declared.equal?(declared) && memo.config.equal?(config) && memo.given == given &&
            memo.absent.none? { |key| job_hash.key?(key) } && memo.present_nil.all? { |key| job_hash.key?(key) }
        end

        def build(job_class, job_hash, declared)
          values = {}
          KEYS.each do |name, key|
            value = job_hash.fetch(key) { declared&.[](key) }
            values[name] = value unless value.nil?
          end
          values.key?(:key) ? JobOptions.cached(job_class, values, prefix: PREFIX) : nil
        end

        # Keys whose job hash value is nil: absent (the class's value counts) or present
        # with nil (the default counts) — the memo holds only while each stays so.
        def remember(job_class, job_hash, memo)
          nil_keys = HASH_KEYS.each_index.select { |i| memo.given[i].nil? && !memo.declared&.[](HASH_KEYS[i]).nil? }
                              .map { |i| HASH_KEYS[i] }
          present_nil, absent = nil_keys.partition { |key| job_hash.key?(key) }
          memo.present_nil = present_nil.freeze
          memo.absent = absent.freeze
          memo.freeze
          @memo_lock.synchronize { @memo = @memo.merge(job_class => memo) }
        end
      end
    end
  end
end
