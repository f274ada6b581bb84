# frozen_string_literal: true

require "sidekiq/api"
require_relative "workloads"

module IdempotentJobBench
  # Section 5: a real `sidekiq` process (Debian's, on the real Redis, durable
  # PostgreSQL) working through N operations plus 30 % duplicates (pushes of an
  # operation key already pushed, mixed in after their original), with the gem's
  # middleware and without it, alternately. The jobs are queued before the process
  # starts; the time runs from the first job's start to the last job's end (see
  # bench/sidekiq_boot.rb). Each job's body records its effect (in the process, one
  # count per operation key): with the middleware every operation's effect must have
  # run exactly once and every record must be completed; without it the duplicates
  # run their effect again (what the middleware prevents).
  class SidekiqRun
    # Worker threads of each process (the same with and without the middleware).
    CONCURRENCY = 10
    # Duplicate pushes per operation, as a fraction of the operations.
    DUPLICATES = 0.3
    # sidekiq-unique-jobs 7.1.33 (`until_executed`), worker side, on this machine kind
    # (issue 14: 10,000 operations + 30 % duplicates, -c 10, measured on a quiet machine;
    # that gem is not installable here, so it is not re-run).
    PEER_JOBS_PER_S = 2375.0
    # Target: the worker side with the middleware at least this many times the peer's.
    PEER_TARGET = 1.2
    # Seconds between Sidekiq's polls of its scheduled set, where a deferred copy waits
    # (sidekiq_boot.rb sets it; Sidekiq's default averages 5 s per process).
    SCHEDULED_POLL = 1
    # The queue the benchmark's jobs go to.
    QUEUE = "bench"
    # The boot file of the worker processes.
    BOOT = File.expand_path("sidekiq_boot.rb", __dir__)
    # Random seed of where the duplicates go (reproducible runs).
    SEED = 14

    # @param db [Database]
    # @param results [Results]
    # @param operations [Integer] operations per run (plus {DUPLICATES} of them pushed again)
    # @param repeats [Integer] runs per mode (alternating which goes first)
    # @param dir [String] where logs and result files go
    # @raise [KeyError] without REDIS_URL
    def initialize(db, results, operations:, repeats:, dir:)
      @db = db
      @results = results
      @operations = operations
      @duplicates = (operations * DUPLICATES).round
      @jobs = @operations + @duplicates
      @repeats = repeats
      @dir = dir
      FileUtils.mkdir_p(dir)
      ENV.fetch("REDIS_URL")
      Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
    end

    # @return [Hash{Symbol => Float}] :without and :with (median jobs/s), :ratio (with /
    #   without) and :peer (with / sidekiq-unique-jobs' figure)
    # @raise [RuntimeError] when a run fails, times out or records the wrong outcome
    def run
      samples = { without: [], with: [] }
      effects = {}
      @repeats.times do |r|
        (r.even? ? %i[without with] : %i[with without]).each do |mode|
          rate, effects[mode] = once(mode, "#{r}#{mode}")
          samples[mode] << rate
        end
      end
      ratios = samples[:with].zip(samples[:without]).map { |w, wo| w / wo }
      figures = { without: Stats.median(samples[:without]), with: Stats.median(samples[:with]),
                  ratio: Stats.median(ratios) }
      figures[:peer] = figures[:with] / PEER_JOBS_PER_S
      report(figures, samples, effects)
      figures
    end

    private

    # @return [Array(Float, Hash)] jobs per second, and the effects the run counted
    def once(mode, id)
      prefix = "r#{Process.pid}-#{id}-"
      enqueue(prefix)
      result = File.join(@dir, "sidekiq-#{id}.json")
      FileUtils.rm_f(result)
      log = File.join(@dir, "sidekiq-#{id}.log")
      figures = work(mode, result, log)
      check(mode, prefix, figures, log)
      rate = figures["jobs"] / figures["seconds"]
      puts "   #{mode} middleware: #{figures["jobs"]} jobs (#{@operations} operations + #{@duplicates} duplicates) " \
           "in #{figures["seconds"].round(2)} s, #{rate.round} jobs/s; effects run #{figures["effects"]}"
      [rate, figures]
    end

    # Queues every operation once and {DUPLICATES} of them a second time, each
    # duplicate {#gap} to 3 × {#gap} pushes behind its original (so it meets a
    # completed record, unless that one is still running: then it is deferred and its
    # copy comes back), all before the last operation.
    def enqueue(prefix)
      ::Sidekiq::Queue.new(QUEUE).clear
      order(prefix).each_slice(1000) do |slice|
        ::Sidekiq::Client.push_bulk("class" => "BenchNoopJob", "queue" => QUEUE, "retry" => false,
                                    "args" => slice.map { |key| [key] })
      end
    end

    # @return [Array<String>] the operation keys in push order (duplicates mixed in)
    def order(prefix)
      rng = Random.new(SEED)
      slots = (1..@operations).map { |i| [i.to_f, "#{prefix}#{i}"] }
      slots += (1..(@operations - (3 * gap))).to_a.sample(@duplicates, random: rng).map do |i|
        [i + gap + rng.rand(gap * 2.0), "#{prefix}#{i}"]
      end
      slots.sort_by(&:first).map(&:last)
    end

    # @return [Integer] the least distance, in pushes, of a duplicate behind its original
    def gap
      [@operations / 20, 10].max
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
      raise "#{figures["operations"]} of #{@operations} operations ran (log: #{log})" unless
        figures["operations"] == @operations
      return check_without(figures, log) unless mode == :with

      unless figures["effects"] == @operations && figures["most"] == 1
        raise "with the middleware #{figures["effects"]} effects ran for #{@operations} operations " \
              "(most for one: #{figures["most"]}; log: #{log})"
      end
      completed = @db.exec("SELECT count(*) FROM idempotent_job_records WHERE job_type = 'BenchNoopJob' " \
                           "AND status = 'completed' AND operation_key LIKE $1", ["#{prefix}%"]).getvalue(0, 0).to_i
      raise "#{completed} of #{@operations} operations recorded completed (log: #{log})" unless completed == @operations
    end

    def check_without(figures, log)
      return if figures["effects"] == @jobs

      raise "without the middleware #{figures["effects"]} effects ran for #{@jobs} jobs (log: #{log})"
    end

    def report(figures, samples, effects)
      record(figures, samples)
      runs = samples.transform_values { |s| s.map(&:round).join(" ") }
      verdict = Format.verdict(figures[:peer] >= PEER_TARGET, "≥ #{Format.ratio(PEER_TARGET)} peer")
      @deferred = effects.dig(:with, "deferred")
      rows = [["without the middleware", Format.num(figures[:without]), "1.00×", "–", effects_text(effects[:without]),
               runs[:without], ""],
              ["with the middleware", Format.num(figures[:with]), Format.ratio(figures[:ratio]),
               Format.ratio(figures[:peer]), effects_text(effects[:with]), runs[:with], verdict],
              ["sidekiq-unique-jobs 7.1.33, until_executed (issue 14, not re-run)", Format.num(PEER_JOBS_PER_S), "–",
               "1.00×", "", "", ""]]
      @results.table("sidekiq", title, ["worker", "jobs/s (median)", "× without", "× peer", "effects run",
                                        "each run", "target"], rows, notes:)
    end

    def record(figures, samples)
      @results.add("sidekiq", "without_middleware", "jobs_per_s", figures[:without], "1/s",
                   "runs: #{samples[:without].map(&:round).join(" ")}")
      @results.add("sidekiq", "with_middleware", "jobs_per_s", figures[:with], "1/s",
                   "runs: #{samples[:with].map(&:round).join(" ")}")
      @results.add("sidekiq", "with_middleware", "ratio_to_without", figures[:ratio], "x")
      @results.add("sidekiq", "with_middleware", "ratio_to_peer", figures[:peer], "x",
                   "sidekiq-unique-jobs #{PEER_JOBS_PER_S.round} jobs/s (issue 14)")
    end

    def title
      "5. A real sidekiq process (Sidekiq #{::Sidekiq::VERSION}, -c #{CONCURRENCY}, Redis, durable PostgreSQL): " \
        "#{@operations} operations + #{@duplicates} duplicates (#{@jobs} no-op jobs)"
    end

    def effects_text(figures)
      return "–" unless figures

      "#{figures["effects"]} (#{figures["once"]} once, most #{figures["most"]})"
    end

    def deferred_text
      "#{@deferred || 0} in the last run, Sidekiq's scheduled poll every #{SCHEDULED_POLL} s"
    end

    def notes
      ["jobs queued first, each duplicate #{gap}–#{gap * 3} pushes behind its original; timed from the first " \
       "job's start to the last one's end; modes alternate; " \
       "jobs/s counts every job (operations and duplicates).",
       "with the middleware each operation is claimed and completed (durable commits, heartbeat on, pool " \
       "#{CONCURRENCY + 5}) and each duplicate turned away (one read-only statement; a duplicate that meets a " \
       "live claim is deferred and comes back: #{deferred_text}); checked: every operation's effect ran once " \
       "and its record is completed. Without it every job's effect runs (#{@jobs}).",
       "× peer: against sidekiq-unique-jobs 7.1.33 (until_executed) on the same workload, #{PEER_JOBS_PER_S.round} " \
       "jobs/s worker side, measured for issue 14 on a quiet machine of this kind; that gem is not installable " \
       "here (no RubyGems), so it is a recorded figure, not a run beside ours.",
       "Sidekiq's own job logging (info) goes to a log file in both modes."]
    end
  end
end
