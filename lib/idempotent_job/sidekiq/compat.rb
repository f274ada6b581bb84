# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # Everything that differs between the Sidekiq versions the door supports (6.4
    # through 8.x), in one place: the job module's name, concurrency, the
    # ActiveJob wrapper's class name, 8.0's millisecond timestamps and the test modes
    # (`sidekiq/testing` before 8.1, `Sidekiq.testing!` from 8.1). Only public API.
    module Compat
      # The running Sidekiq's version.
      VERSION = Gem::Version.new(::Sidekiq::VERSION)
      # Class names of Sidekiq's ActiveJob wrapper: the adapter's before 8.0, Sidekiq's own from 8.0.
      ACTIVE_JOB_WRAPPERS = %w[ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper Sidekiq::ActiveJob::Wrapper].freeze
      # Timestamps at or above this are milliseconds since the epoch (Sidekiq 8), below it
      # seconds: the core's rule (the repeats report reads recorded times by it too).
      MILLISECONDS_FROM = Native::MILLISECONDS_FROM

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
      #   integer milliseconds divided by 1000); anything else as given
      def seconds(value)
        return value unless value.is_a?(Numeric)

        value >= MILLISECONDS_FROM ? value / 1000.0 : value.to_f
      end

      # Loads Sidekiq's testing API without choosing a mode when one is set: from 8.1
      # `Sidekiq.testing!(:fake)` (the replacement of `require "sidekiq/testing"`),
      # before it `require "sidekiq/testing"` (which defaults to fake).
      # @return [void]
      def load_testing!
        return if defined?(::Sidekiq::Testing)
        return require("sidekiq/testing") unless ::Sidekiq.respond_to?(:testing!)

        ::Sidekiq.testing!(:fake)
      end

      # @return [Boolean] whether Sidekiq's testing API is loaded and inline
      def inline?
        defined?(::Sidekiq::Testing) ? ::Sidekiq::Testing.inline? : false
      end

      # @return [Boolean] whether Sidekiq's testing API is loaded and fake (jobs go to in-memory queues)
      def fake?
        defined?(::Sidekiq::Testing) ? ::Sidekiq::Testing.fake? : false
      end

      # A client whose middleware chain is a copy of the configured client chain with
      # `klass` added last, leaving the configured chain untouched. Sidekiq 7+'s
      # `Client#middleware { }` copies the chain shallowly (an added entry lands in the
      # configured chain too), so there the copy is made with `copy_for` (how Sidekiq
      # gives each capsule its chains) and handed over as `chain:`; 6.4's dup is deep.
      # @param klass [Class] a client middleware
      # @param args [Array] its constructor arguments
      # @return [Sidekiq::Client]
      def client_with(klass, *args)
        unless ::Sidekiq.respond_to?(:default_configuration)
          return ::Sidekiq::Client.new.tap { |client| client.middleware { |chain| chain.add(klass, *args) } }
        end

        config = ::Sidekiq.default_configuration
        chain = config.client_middleware.copy_for(config)
        chain.add(klass, *args)
        ::Sidekiq::Client.new(chain:, config:)
      end

      # @return [Hash{String => Array<Hash>}] the fake queues by job class
      #   (`jobs_by_worker` in Sidekiq 6, `jobs_by_class` later)
      def fake_jobs_by_class
        queues = ::Sidekiq::Queues
        queues.respond_to?(:jobs_by_class) ? queues.jobs_by_class : queues.jobs_by_worker
      end
    end
  end
end
