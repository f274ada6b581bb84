# frozen_string_literal: true

# Loaded by the real `sidekiq` process of spec/integration: the spec jobs, the
# middleware, and the gem configured from DATABASE_URL.
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "idempotent_job/sidekiq"
require_relative "services"
require_relative "effects"
require_relative "jobs"

# Deferred deliveries sit in the scheduled set: poll it every second or so
# (`config[...]` from Sidekiq 6.5/7, `config.options` on 6.4).
Sidekiq.configure_server do |config|
  config.respond_to?(:[]=) ? config[:poll_interval_average] = 1 : config.options[:poll_interval_average] = 1
end

IdempotentJob.configure do |c|
  # A spec may start a worker with a wrong URL of its own (a role that does not exist).
  c.database_url = ENV["IDEMPOTENT_JOB_SPEC_WORKER_URL"] || ENV.fetch("DATABASE_URL")
  c.lease = 30
end
require_relative "hostile_values"
