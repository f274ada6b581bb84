# frozen_string_literal: true

# Loaded by the real `sidekiq` process of the ActiveJob specs: the suite's Sidekiq
# boot (gem, middleware, poll interval) plus the ActiveJob spec jobs on ActiveJob's
# :sidekiq adapter.
require_relative "sidekiq_boot"
require_relative "active_job_jobs"

ActiveRecord::Base.establish_connection(SpecServices.active_record_url)
ActiveJob::Base.queue_adapter = :sidekiq

# Counts the jobs this worker process has in hand, in Redis, at once (Sidekiq's own
# busy list is written by its heartbeat, seconds late), under a key naming the pid so
# the count of a SIGKILLed worker can be told apart: the spec waits for zero.
class SpecInflight
  PREFIX = "spec:active_job:inflight:"

  def call(_worker, _job, _queue)
    Sidekiq.redis { |redis| redis.incr("#{PREFIX}#{Process.pid}") }
    yield
  ensure
    Sidekiq.redis { |redis| redis.decr("#{PREFIX}#{Process.pid}") }
  end
end

Sidekiq.configure_server { |config| config.server_middleware { |chain| chain.prepend(SpecInflight) } }
