# frozen_string_literal: true

# Loaded by the real `sidekiq` process of the fault suite. The gem talks to
# FAULT_GEM_URL (the fault database, directly or through the proxy); every run of a
# job body, every failed delivery and every claim's duration is appended to files
# under FAULT_DIR, so the spec can count them after the process is gone.
$LOAD_PATH.unshift File.expand_path("../../../lib", __dir__)
require "sidekiq"
# redis-rb is Sidekiq 6's client only (7+ use redis-client and load no Redis constant).
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "idempotent_job/sidekiq"

# Poll the scheduled and retry sets every second or so: `config[...]` from Sidekiq 6.5
# (7+ have no `config.options`), `Sidekiq.options` on 6.4, whose config has no `[]=`.
Sidekiq.configure_server do |config|
  config.respond_to?(:[]=) ? config[:poll_interval_average] = 1 : Sidekiq.options[:poll_interval_average] = 1
end

# Appends one line to a file of FAULT_DIR (O_APPEND: whole lines from many threads).
module FaultLog
  def self.add(name, line)
    File.open(File.join(ENV.fetch("FAULT_DIR"), name), "a") { |f| f.write("#{line}\n") }
  end
end

# Outside the gem's middleware: records failed deliveries and how long each delivery
# took to reach its body (its claim) or to fail before it.
class FaultRecorder
  def call(_job, job_hash, _queue)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    Thread.current[:fault_started] = started
    yield
  rescue Exception => e # rubocop:disable Lint/RescueException -- recorded, then re-raised
    FaultLog.add("failures", "#{job_hash["args"].first} #{e.class}: #{e.message.tr("\n", " ")}")
    FaultLog.add("claims", (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).round(3)) unless
      Thread.current[:fault_started].nil?
    raise
  ensure
    ended = Thread.current[:fault_body_end]
    FaultLog.add("completions", (Process.clock_gettime(Process::CLOCK_MONOTONIC) - ended).round(3)) if ended
    Thread.current[:fault_started] = Thread.current[:fault_body_end] = nil
  end
end

# One operation per op id; the body's run is the effect.
class FaultJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :operation, retry: 25
  sidekiq_retry_in { 1 }

  def perform(operation)
    started = Thread.current[:fault_started]
    if started
      FaultLog.add("claims", (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).round(3))
      Thread.current[:fault_started] = nil
    end
    FaultLog.add("effects", "#{operation} #{Process.pid} #{idempotency_claim.token}")
    sleep Float(ENV.fetch("FAULT_WORK", "0.05"))
    Thread.current[:fault_body_end] = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.prepend(FaultRecorder) }
end

IdempotentJob.configure do |c|
  c.database_url = ENV.fetch("FAULT_GEM_URL")
  c.application_name = "idempotent_job_faults"
  c.lease = Float(ENV.fetch("FAULT_LEASE", "10"))
  ENV.fetch("FAULT_SETTINGS", "").split(",").each do |pair|
    name, value = pair.split("=")
    c.public_send("#{name}=", Float(value))
  end
end
