# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # Reads a Sidekiq job's idempotency options: from the job hash (where Sidekiq
    # merges `sidekiq_options` at enqueue, and `set(...)` overrides them per push), else
    # from the class. The values are resolved and validated once per class and values
    # ({JobOptions.cached}).
    module Options
      # Option names in the job hash, by {JobOptions::NAMES}.
      KEYS = JobOptions::NAMES.to_h { |name| [name, "idempotency_#{name}"] }.freeze
      # Prefix of the option names, for messages.
      PREFIX = "idempotency_"

      module_function

      # @param job_class [Class, String] the job class (or its name if not loadable)
      # @param job_hash [Hash] Sidekiq's job payload
      # @return [JobOptions, nil] nil for jobs without `idempotency_key` (passed through)
      # @raise [OperationKeyError] for a malformed key declaration
      # @raise [ConfigurationError] for a bad lease, scope, policy, heartbeat or lookup
      def resolve(job_class, job_hash)
        declared = job_class.respond_to?(:get_sidekiq_options) ? job_class.get_sidekiq_options : nil
        values = {}
        KEYS.each do |name, key|
          value = job_hash.key?(key) ? job_hash[key] : declared&.[](key)
          values[name] = value unless value.nil?
        end
        return nil unless values.key?(:key)

        JobOptions.cached(job_class, values, prefix: PREFIX)
      end
    end
  end
end
