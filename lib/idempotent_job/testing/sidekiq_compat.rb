# frozen_string_literal: true

module IdempotentJob
  module Testing
    # What differs between Sidekiq versions (6.4 through 8.x) in the testing API the kit
    # uses: loading it (`sidekiq/testing` before 8.1, `Sidekiq.testing!` from 8.1), its
    # fake queues, and a client with one more middleware. The door's own differences
    # are in {IdempotentJob::Sidekiq::Compat}. Only public API. Internal to the kit.
    module SidekiqCompat
      module_function

      # Loads Sidekiq's testing API without choosing a mode when one is set: from 8.1
      # `Sidekiq.testing!(:fake)` (the replacement of `require "sidekiq/testing"`),
      # before it `require "sidekiq/testing"` (which defaults to fake).
      # @return [void]
      def load_testing!
        return if defined?(::Sidekiq::Testing)
        return require("sidekiq/testing") unless ::Sidekiq.respond_to?(:testing!)

        ::Sidekiq.testing!(:fake)
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
