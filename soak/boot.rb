# frozen_string_literal: true

# Loaded by each of the soak's workers:
#   SOAK_WORKER_ID=w1-1 SOAK_STAND_IN=127.0.0.1:PORT sidekiq -r ./soak/boot.rb -q soak -c 5
# (bin/soak starts them). The gem's middleware and settings, the soak's jobs, its fetch
# and observer, the event journal, and JSON log lines (one line per message, backtraces
# included) for the driver's log scan. SOAK_CONTROL=1 removes the gem's middleware.
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "idempotent_job/sidekiq"
require_relative "worker"

IdempotentJob.configure do |c|
  c.database_url = ENV.fetch("DATABASE_URL")
  c.lease = Soak.lease
end
IdempotentJob.subscribe { |name, payload| Soak::Journal.observe(name, payload) }

Sidekiq.configure_server do |config|
  # The logger's formatter (public on 6.4 and 7+; 6.4's config.log_formatter= is gone in 7).
  config.logger.formatter = Sidekiq::Logger::Formatters::JSON.new
  # Deliveries the gem deferred behind a live claim, and retries, sit in the scheduled
  # and retry sets: look for due ones about every second (6.4's knob) instead of every 5 s.
  # `config[...]` and a fetch class built per capsule from Sidekiq 7; `config.options`
  # and a fetch instance on 6.4.
  if config.respond_to?(:capsules)
    config[:poll_interval_average] = 1
    config[:fetch_class] = Soak::ReliableFetch
  else
    config.options[:poll_interval_average] = 1
    config.options[:fetch] = Soak::ReliableFetch.new(config.options)
  end
  config.server_middleware do |chain|
    chain.prepend(Soak::Observer)
    # The control run (bin/soak --control): the same jobs without the gem's middleware.
    chain.remove(IdempotentJob::Sidekiq::ServerMiddleware) if ENV["SOAK_CONTROL"] == "1"
  end
  # The first heartbeat comes once the processors are fetching: the driver waits for it.
  config.on(:heartbeat) do
    Sidekiq.redis { |redis| redis.set("#{Soak::Journal::READY_PREFIX}#{Soak.worker_id}", Process.pid) }
  end
end
