# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # Payloads of Sidekiq's ActiveJob adapter (`wrapped` names the ActiveJob class):
    # the Sidekiq door passes them through untouched, so the ActiveJob door claims them
    # exactly once, under the ActiveJob class. An idempotency_key given the Sidekiq way
    # (`sidekiq_options idempotency_key:` on the ActiveJob class, or in the payload)
    # would key the wrapper's serialized envelope (job_id included): it is refused,
    # never silently ignored.
    module Wrapped
      module_function

      # @param job_hash [Hash] the wrapper's payload
      # @yield the rest of the chain (the ActiveJob door claims inside it)
      # @return [Object] the block's value
      # @raise [ConfigurationError] when the payload or the wrapped class declares an idempotency_key
      def check!(job_hash)
        name = job_hash["wrapped"].to_s
        if declared?(job_hash, name)
          raise ConfigurationError, "#{name}: an ActiveJob class run through Sidekiq's ActiveJob adapter cannot " \
                                    "declare sidekiq_options idempotency_key (it would key the adapter's " \
                                    "envelope, job_id included): use `include IdempotentJob::ActiveJob` and " \
                                    "`idempotency key: ...` (require \"idempotent_job/active_job\")"
        end
        yield
      end

      # @return [Boolean] whether an idempotency_key was declared the Sidekiq way
      def declared?(job_hash, name)
        return true if job_hash.key?(Options::KEYS[:key])

        klass = Object.const_get(name)
        klass.respond_to?(:get_sidekiq_options) && !klass.get_sidekiq_options[Options::KEYS[:key]].nil?
      rescue NameError
        false
      end
    end
  end
end
