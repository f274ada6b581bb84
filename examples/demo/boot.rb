# frozen_string_literal: true

# Loaded by the demo's worker: `sidekiq -r ./examples/demo/boot.rb -c 5 -q default`.
# The gem's middleware, its settings, the example jobs, and a small outer middleware
# that counts the deliveries reaching this worker.
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "idempotent_job/sidekiq"
require_relative "jobs"

IdempotentJob.configure do |c|
  c.database_url = ENV.fetch("DATABASE_URL")
  c.lease = Demo::LEASE
end

module Demo
  # Outermost server middleware, for the demo's report only: counts every delivery of an
  # operation that reaches a worker (the gem's middleware then decides it), how long each
  # spent in the worker, and how many deliveries this process has in hand, so the demo
  # knows when the worker is idle.
  class Arrivals
    def call(job_instance, job_hash, _queue)
      inflight = "#{INFLIGHT_PREFIX}#{Process.pid}"
      ::Sidekiq.redis { |redis| redis.incr(inflight) }
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      operation = nil
      begin
        operation = count(job_instance, job_hash)
        yield
      ensure
        ::Sidekiq.redis do |redis|
          elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
          redis.rpush("#{DURATIONS_PREFIX}#{operation}", format("%.3f", elapsed)) if operation
          redis.decr(inflight)
        end
      end
    end

    private

    # @return [String, nil] the operation's id ("JobClass key"), nil for other jobs
    def count(job_instance, job_hash)
      job_class = job_instance.class
      return nil unless job_class.respond_to?(:demo_operation_key)

      operation = "#{job_class.name} #{job_class.demo_operation_key(job_hash["args"])}"
      ::Sidekiq.redis { |redis| redis.hincrby(ARRIVALS_KEY, operation, 1) }
      operation
    end
  end
end

Sidekiq.configure_server do |config|
  # Look for due scheduled jobs (deliveries the gem deferred) about every second
  # instead of every 5 s, to keep the demo short.
  # `config[...]` from Sidekiq 6.5/7, `config.options` on 6.4.
  config.respond_to?(:[]=) ? config[:poll_interval_average] = 1 : config.options[:poll_interval_average] = 1
  config.server_middleware { |chain| chain.prepend(Demo::Arrivals) }
  # Fired by the first heartbeat, once the worker threads are starting: bin/demo waits for it.
  config.on(:heartbeat) { Sidekiq.logger.info("demo: worker ready") }
end
