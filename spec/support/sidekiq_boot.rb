# frozen_string_literal: true

# Loaded by the real `sidekiq` process of spec/integration: the spec jobs, the
# middleware, and the gem configured from DATABASE_URL.
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "sidekiq"
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)
require "idempotent_job/sidekiq"
require_relative "services"
require_relative "effects"
require_relative "jobs"

# Deferred deliveries sit in the scheduled set: poll it every second or so (6.4's knob).
Sidekiq.configure_server { |config| config.options[:poll_interval_average] = 1 }

IdempotentJob.configure do |c|
  c.database_url = ENV.fetch("DATABASE_URL")
  c.lease = 30
end
