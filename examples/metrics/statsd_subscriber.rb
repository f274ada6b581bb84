# frozen_string_literal: true

require "socket"

# StatsD-style counters from idempotent_job's events: one counter per event and job
# type (`idempotent_job.skipped.ChargeOrderJob:1|c`), and a timer for the events that
# carry a duration (claimed: the claim's round trip; completed: the body's run).
# Sent over UDP, fire and forget: a metrics server that is down never slows or fails
# a delivery.
class IdempotentJobStatsd
  # @param host [String] the StatsD server (or agent: Datadog, Telegraf…)
  # @param port [Integer]
  # @param prefix [String] the metric names' prefix
  def initialize(host: "127.0.0.1", port: 8125, prefix: "idempotent_job")
    @socket = UDPSocket.new
    @socket.connect(host, port)
    @prefix = prefix
  end

  # @param name [Symbol] the event (IdempotentJob::Events::NAMES)
  # @param payload [Hash] its payload (job_type, duration in seconds…)
  # @return [void]
  def call(name, payload)
    job_type = payload[:job_type].to_s.gsub(/[^A-Za-z0-9_-]/, "_")
    metric = job_type.empty? ? "#{@prefix}.#{name}" : "#{@prefix}.#{name}.#{job_type}"
    lines = ["#{metric}:1|c"]
    lines << "#{metric}.duration:#{(payload[:duration] * 1000).round(3)}|ms" if payload[:duration]
    @socket.send(lines.join("\n"), 0)
  rescue SystemCallError
    nil # a lost metric never fails a delivery
  end
end

# config/initializers/idempotent_job.rb
statsd = IdempotentJobStatsd.new(host: ENV.fetch("STATSD_HOST", "127.0.0.1"),
                                 port: Integer(ENV.fetch("STATSD_PORT", "8125")))
IdempotentJob.subscribe { |name, payload| statsd.call(name, payload) }
