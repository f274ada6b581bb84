# frozen_string_literal: true

require_relative "dependency"
IdempotentJob::Dependency.require!(IdempotentJob::Dependency::SIDEKIQ)
require "idempotent_job"
require_relative "sidekiq/compat"
require_relative "sidekiq/options"
require_relative "sidekiq/door"
require_relative "sidekiq/wrapped"
require_relative "sidekiq/unwritable"
require_relative "sidekiq/server_middleware"
require_relative "sidekiq/client_middleware"

module IdempotentJob
  # The Sidekiq door: `require "idempotent_job/sidekiq"` adds {ServerMiddleware} to the
  # server chain and {ClientMiddleware} to the client chains, and registers the door
  # (Sidekiq's logger and concurrency as defaults, reruns of resolved operations).
  # Written against the middleware API shared by Sidekiq 6.4 to 8.x (plain classes
  # with `call`); version differences live in {Compat}. Requiring it without a
  # supported Sidekiq raises {DependencyError} naming the Gemfile line to add.
  module Sidekiq
    # Adds the middleware to Sidekiq's chains and registers the door (called when
    # this file is required).
    # @return [void]
    def self.install!
      Options.install!
      ::Sidekiq.configure_server do |config|
        config.server_middleware { |chain| chain.add(ServerMiddleware) }
        config.client_middleware { |chain| chain.add(ClientMiddleware) }
      end
      ::Sidekiq.configure_client do |config|
        config.client_middleware { |chain| chain.add(ClientMiddleware) }
      end
      IdempotentJob::Door.register(Door.new)
    end
  end
end

IdempotentJob::Sidekiq.install!
