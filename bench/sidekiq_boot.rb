# frozen_string_literal: true

# Booted by the benchmark's worker: `sidekiq -r bench/sidekiq_boot.rb -c 10 -q bench`.
# BENCH_MIDDLEWARE=1 loads the gem's middleware (`require "idempotent_job/sidekiq"`);
# otherwise the same job runs without it. An outermost middleware times the run from
# the first job's start to the BENCH_JOBS-th job's end (process boot excluded) and
# writes the figures to BENCH_RESULT as JSON.
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "json"
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)

if ENV["BENCH_MIDDLEWARE"] == "1"
  require "idempotent_job/sidekiq"
  IdempotentJob.configure { |c| c.database_url = ENV.fetch("DATABASE_URL") }
end

# A job that does nothing. Its operation key is its only argument (unique per job).
class BenchNoopJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: 0, retry: false

  # @param _key [String]
  # @return [nil]
  def perform(_key); end
end

module IdempotentJobBench
  # Outermost server middleware: counts jobs ended (and failed) and writes
  # `{jobs:, failed:, seconds:}` once BENCH_JOBS jobs have ended; seconds run from
  # the first job's start to the last one's end, on the monotonic clock.
  class Stopwatch
    @lock = Mutex.new
    @ended = 0
    @failed = 0
    @started = nil

    class << self
      # Notes a job's start.
      # @return [void]
      def started
        @lock.synchronize { @started ||= Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      end

      # Notes a job's end; writes the result after the last.
      # @param failed [Boolean]
      # @return [void]
      def ended(failed)
        @lock.synchronize do
          @ended += 1
          @failed += 1 if failed
          write if @ended == Integer(ENV.fetch("BENCH_JOBS"))
        end
      end

      private

      def write
        seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - @started
        path = ENV.fetch("BENCH_RESULT")
        File.write("#{path}.tmp", JSON.generate(jobs: @ended, failed: @failed, seconds:))
        File.rename("#{path}.tmp", path)
      end
    end

    # @param _job [Object]
    # @param _hash [Hash]
    # @param _queue [String]
    # @yield the rest of the chain and the job
    def call(_job, _hash, _queue)
      self.class.started
      failed = true
      yield
      failed = false
    ensure
      self.class.ended(failed)
    end
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.prepend(IdempotentJobBench::Stopwatch) }
end
