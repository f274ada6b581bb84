# frozen_string_literal: true

# Booted by the benchmark's worker: `sidekiq -r bench/sidekiq_boot.rb -c 10 -q bench`.
# BENCH_MIDDLEWARE=1 loads the gem's middleware (`require "idempotent_job/sidekiq"`),
# BENCH_MIDDLEWARE=hand the hand-written guard (bench/sidekiq_guard.rb, innermost);
# otherwise the same job runs without a guard. An outermost middleware times the run from
# the first job's start to the end of the BENCH_JOBS-th job (plus one for each delivery
# the guard deferred: its copy comes back) and writes the figures to BENCH_RESULT as
# JSON, with the effects the job bodies counted (process boot excluded).
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "json"
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)

module IdempotentJobBench
  # The effect of each job body: a count per operation key, in this process.
  module Effects
    @lock = Mutex.new
    @counts = Hash.new(0)

    class << self
      # Counts one run of the effect of `key`.
      # @param key [String]
      # @return [void]
      def run(key)
        @lock.synchronize { @counts[key] += 1 }
      end

      # @return [Hash{String => Integer}] effects in all, operations whose effect ran,
      #   how many ran once, the most for one operation
      def figures
        @lock.synchronize do
          { effects: @counts.values.sum, operations: @counts.size, once: @counts.count { |_, n| n == 1 },
            most: @counts.values.max || 0 }
        end
      end
    end
  end
end

if ENV["BENCH_MIDDLEWARE"] == "1"
  require "idempotent_job/sidekiq"
  IdempotentJob.configure { |c| c.database_url = ENV.fetch("DATABASE_URL") }
  IdempotentJob.subscribe(:deferred) { IdempotentJobBench::Stopwatch.deferred }
end

# A job whose body only records its effect. Its operation key is its only argument.
class BenchNoopJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: 0, retry: false

  # @param key [String]
  # @return [void]
  def perform(key)
    IdempotentJobBench::Effects.run(key)
  end
end

module IdempotentJobBench
  # Outermost server middleware: counts jobs ended (and failed) and writes
  # `{jobs:, failed:, deferred:, seconds:, cpu:, effects:, operations:, once:, most:}`
  # once BENCH_JOBS jobs (plus the deferred copies) have ended; seconds run from the
  # first job's start to the last one's end, on the monotonic clock; cpu is the
  # process's CPU seconds (every thread) over the same span.
  class Stopwatch
    @lock = Mutex.new
    @ended = 0
    @failed = 0
    @deferred = 0
    @started = nil

    class << self
      # Notes a job's start.
      # @return [void]
      def started
        @lock.synchronize do
          @cpu ||= Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
          @started ||= Process.clock_gettime(Process::CLOCK_MONOTONIC)
        end
      end

      # Notes a delivery the gem deferred (its copy is one more job to wait for).
      # @return [void]
      def deferred
        @lock.synchronize { @deferred += 1 }
      end

      # Notes a job's end; writes the result after the last.
      # @param failed [Boolean]
      # @return [void]
      def ended(failed)
        @lock.synchronize do
          @ended += 1
          @failed += 1 if failed
          write if @ended == Integer(ENV.fetch("BENCH_JOBS")) + @deferred
        end
      end

      private

      def write
        seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - @started
        cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - @cpu
        path = ENV.fetch("BENCH_RESULT")
        figures = { jobs: @ended - @deferred, failed: @failed, deferred: @deferred, seconds:, cpu: }
        File.write("#{path}.tmp", JSON.generate(figures.merge(Effects.figures)))
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
  config.server_middleware do |chain|
    chain.prepend(IdempotentJobBench::Stopwatch)
    if ENV["BENCH_MIDDLEWARE"] == "hand"
      require_relative "sidekiq_guard"
      IdempotentJobBench::SidekiqGuard.setup(url: ENV.fetch("DATABASE_URL"),
                                             size: Integer(ENV.fetch("BENCH_CONCURRENCY")),
                                             deferred: -> { IdempotentJobBench::Stopwatch.deferred })
      chain.add(IdempotentJobBench::SidekiqGuard)
    end
  end
  # A deferred copy waits in the scheduled set: poll it every second (bench/sidekiq_run.rb).
  options = config.respond_to?(:[]=) ? config : Sidekiq.options # Sidekiq 7+ : 6.x
  options[:average_scheduled_poll_interval] = 1
end
