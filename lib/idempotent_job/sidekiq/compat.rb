# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # Everything that differs between the Sidekiq versions the door supports (6.4
    # through 8.x), in one place: the job module's name, concurrency, the
    # ActiveJob wrapper's class name, 8.0's millisecond timestamps and whether inline
    # testing is on (the testing kit's differences: {Testing::SidekiqCompat}). Only public API.
    module Compat
      # The running Sidekiq's version.
      VERSION = Gem::Version.new(::Sidekiq::VERSION)
      # Class names of Sidekiq's ActiveJob wrapper: the adapter's before 8.0, Sidekiq's own from 8.0.
      ACTIVE_JOB_WRAPPERS = %w[ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper Sidekiq::ActiveJob::Wrapper].freeze

      module_function

      # @return [Module] Sidekiq::Job (6.3 and later) or Sidekiq::Worker
      def job_module
        defined?(::Sidekiq::Job) ? ::Sidekiq::Job : ::Sidekiq::Worker
      end

      # @return [Integer, nil] the server's concurrency; nil outside a Sidekiq server
      def concurrency
        return nil unless ::Sidekiq.respond_to?(:server?) && ::Sidekiq.server?

        if ::Sidekiq.respond_to?(:default_configuration) then ::Sidekiq.default_configuration[:concurrency]
        elsif ::Sidekiq.respond_to?(:options) then ::Sidekiq.options[:concurrency]
        end
      end

      # @param job_hash [Hash] a payload
      # @return [Boolean] whether Sidekiq's ActiveJob adapter wrapped it (the `wrapped` key)
      def active_job?(job_hash)
        job_hash.key?("wrapped") || ACTIVE_JOB_WRAPPERS.include?(job_hash["class"].to_s)
      end

      # @param value [Numeric, String, nil] a payload timestamp (`enqueued_at`, `created_at`, `at`)
      # @return [Float, Object, nil] seconds since the epoch for a number (Sidekiq 8's
      #   integer milliseconds divided by 1000: at or above the core's
      #   `Native::MILLISECONDS_FROM`, the rule the repeats report reads recorded times by);
      #   anything else as given
      def seconds(value)
        return value unless value.is_a?(Numeric)

        value >= Native::MILLISECONDS_FROM ? value / 1000.0 : value.to_f
      end

      # @return [Boolean] whether Sidekiq's testing API is loaded and inline
      def inline?
        defined?(::Sidekiq::Testing) ? ::Sidekiq::Testing.inline? : false
      end
    end
  end
end
