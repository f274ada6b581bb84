# frozen_string_literal: true

require "sidekiq/api"
require_relative "workloads"

module IdempotentJobBench
  # Section 5: a real `sidekiq` process (Debian's, on the real Redis) draining N
  # no-op jobs, with the gem's middleware (each job its own operation: a claim and a
  # completion with durable commits) and without it, alternately. The jobs are queued
  # before the process starts; the time runs from the first job's start to the last
  # job's end (see bench/sidekiq_boot.rb).
  class SidekiqRun
    # Worker threads of each process (the same with and without the middleware).
    CONCURRENCY = 10
    # The queue the benchmark's jobs go to.
    QUEUE = "bench"
    # The boot file of the worker processes.
    BOOT = File.expand_path("sidekiq_boot.rb", __dir__)

    # @param db [Database]
    # @param results [Results]
    # @param jobs [Integer] jobs per run
    # @param repeats [Integer] runs per mode (alternating which goes first)
    # @param dir [String] where logs and result files go
    # @raise [KeyError] without REDIS_URL
    def initialize(db, results, jobs:, repeats:, dir:)
      @db = db
      @results = results
      @jobs = jobs
      @repeats = repeats
      @dir = dir
      FileUtils.mkdir_p(dir)
      ENV.fetch("REDIS_URL")
      Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
    end

    # @return [Hash{Symbol => Float}] :without and :with (median jobs/s) and :ratio
    # @raise [RuntimeError] when a run fails, times out or records the wrong outcome
    def run
      samples = { without: [], with: [] }
      @repeats.times do |r|
        (r.even? ? %i[without with] : %i[with without]).each { |mode| samples[mode] << once(mode, "#{r}#{mode}") }
      end
      ratios = samples[:with].zip(samples[:without]).map { |w, wo| w / wo }
      figures = { without: Stats.median(samples[:without]), with: Stats.median(samples[:with]),
                  ratio: Stats.median(ratios) }
      report(figures, samples)
      figures
    end

    private

    # @return [Float] jobs per second
    def once(mode, id)
      prefix = "r#{Process.pid}-#{id}-"
      enqueue(prefix)
      result = File.join(@dir, "sidekiq-#{id}.json")
      FileUtils.rm_f(result)
      log = File.join(@dir, "sidekiq-#{id}.log")
      figures = work(mode, result, log)
      check(mode, prefix, figures, log)
      rate = figures["jobs"] / figures["seconds"]
      puts "   #{mode} middleware: #{@jobs} jobs in #{figures["seconds"].round(2)} s, #{rate.round} jobs/s"
      rate
    end

    def enqueue(prefix)
      ::Sidekiq::Queue.new(QUEUE).clear
      (1..@jobs).each_slice(1000) do |slice|
        ::Sidekiq::Client.push_bulk("class" => "BenchNoopJob", "queue" => QUEUE, "retry" => false,
                                    "args" => slice.map { |i| ["#{prefix}#{i}"] })
      end
    end

    def work(mode, result, log)
      env = { "BENCH_MIDDLEWARE" => mode == :with ? "1" : "0", "BENCH_JOBS" => @jobs.to_s, "BENCH_RESULT" => result }
      pid = Process.spawn(env, "sidekiq", "-r", BOOT, "-c", CONCURRENCY.to_s, "-q", QUEUE, "-t", "5",
                          %i[out err] => [log, "w"])
      wait_for(result, pid, log)
      JSON.parse(File.read(result))
    ensure
      stop(pid) if pid
    end

    def wait_for(result, pid, log)
      deadline = Clock.now + 60 + (@jobs / 100.0)
      until File.exist?(result)
        raise "sidekiq exited early (log: #{log})" if Process.wait(pid, Process::WNOHANG)
        raise "sidekiq did not finish #{@jobs} jobs in time (log: #{log})" if Clock.now > deadline

        sleep 0.1
      end
    end

    def stop(pid)
      Process.kill("TERM", pid)
      100.times do
        return if Process.wait(pid, Process::WNOHANG)

        sleep 0.1
      end
      Process.kill("KILL", pid)
      Process.wait(pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end

    def check(mode, prefix, figures, log)
      raise "#{figures["failed"]} jobs failed (log: #{log})" unless figures["failed"].zero?
      return unless mode == :with

      completed = @db.exec("SELECT count(*) FROM idempotent_job_records WHERE job_type = 'BenchNoopJob' " \
                           "AND status = 'completed' AND operation_key LIKE $1", ["#{prefix}%"]).getvalue(0, 0).to_i
      raise "#{completed} of #{@jobs} operations recorded completed (log: #{log})" unless completed == @jobs
    end

    def report(figures, samples)
      @results.add("sidekiq", "without_middleware", "jobs_per_s", figures[:without], "1/s",
                   "runs: #{samples[:without].map(&:round).join(" ")}")
      @results.add("sidekiq", "with_middleware", "jobs_per_s", figures[:with], "1/s",
                   "runs: #{samples[:with].map(&:round).join(" ")}")
      @results.add("sidekiq", "with_middleware", "ratio_to_without", figures[:ratio], "x")
      runs = samples.transform_values { |s| s.map(&:round).join(" ") }
      rows = [["without the middleware", Format.num(figures[:without]), "1.00×", runs[:without]],
              ["with the middleware", Format.num(figures[:with]), Format.ratio(figures[:ratio]), runs[:with]]]
      @results.table("sidekiq", "5. A real sidekiq process (Sidekiq #{::Sidekiq::VERSION}, -c #{CONCURRENCY}, " \
                                "Redis) draining #{@jobs} no-op jobs",
                     ["worker", "jobs/s (median)", "ratio", "each run"], rows,
                     notes: ["jobs queued first; timed from the first job's start to the last one's end; " \
                             "modes alternate; with the middleware every job is a new operation (claim + " \
                             "completion, durable commits, heartbeat on, pool #{CONCURRENCY + 5}); checked: " \
                             "every operation recorded completed.",
                             "Sidekiq's own job logging (info) goes to a log file in both modes."])
    end
  end
end
