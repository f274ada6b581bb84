# frozen_string_literal: true

require "sidekiq/api"
require_relative "workloads"
require_relative "server_times"
require_relative "sidekiq_guard"
require_relative "sidekiq_statements"

module IdempotentJobBench
  # Section 5: a real `sidekiq` process (Debian's, on the real Redis, durable
  # PostgreSQL) working through N operations plus 30 % duplicates (pushes of an
  # operation key already pushed, mixed in after their original) three ways,
  # alternately: without a guard, with the gem's middleware, and with a hand-written
  # guard (bench/sidekiq_guard.rb: INSERT … ON CONFLICT DO NOTHING RETURNING, then
  # UPDATE, prepared, durable, a narrow table of its own). The jobs are queued before
  # the process starts; the time runs from the first job's start to the last job's end
  # (see bench/sidekiq_boot.rb). Each job's body records its effect (in the process,
  # one count per operation key): with either guard every operation's effect must have
  # run exactly once and every record must be completed; without one the duplicates
  # run their effect again (what a guard prevents). WAL bytes (insert position) and
  # durable commits (transaction ids assigned) are counted over each run.
  class SidekiqRun
    include SidekiqStatements

    # Worker threads of each process (the same in every mode).
    CONCURRENCY = 10
    # Duplicate pushes per operation, as a fraction of the operations.
    DUPLICATES = 0.3
    # sidekiq-unique-jobs 7.1.33 (`until_executed`), worker side, on this machine kind
    # (issue 14: 10,000 operations + 30 % duplicates, -c 10, measured on a quiet machine;
    # that gem is not installable here, so it is not re-run).
    PEER_JOBS_PER_S = 2375.0
    # Target: the worker side with the middleware at least this many times the peer's.
    PEER_TARGET = 1.2
    # Target (issue 21): the gem's drain at most this many times the hand-written guard's.
    HAND_TARGET = 1.10
    # Seconds between Sidekiq's polls of its scheduled set, where a deferred copy waits
    # (sidekiq_boot.rb sets it; Sidekiq's default averages 5 s per process).
    SCHEDULED_POLL = 1
    # The queue the benchmark's jobs go to.
    QUEUE = "bench"
    # The boot file of the worker processes.
    BOOT = File.expand_path("sidekiq_boot.rb", __dir__)
    # Random seed of where the duplicates go (reproducible runs).
    SEED = 14
    # The modes, in the order of the first round (each round starts one further on),
    # and what sidekiq_boot.rb's BENCH_MIDDLEWARE says for each.
    MODES = { without: "0", with: "1", hand: "hand" }.freeze
    # What the tables call each mode.
    LABELS = { without: "no guard", with: "the gem's middleware",
               hand: "hand-written guard (pg: INSERT … ON CONFLICT, UPDATE)" }.freeze

    # @param db [Database]
    # @param results [Results]
    # @param operations [Integer] operations per run (plus {DUPLICATES} of them pushed again)
    # @param repeats [Integer] runs per mode (rotating which goes first)
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

    # @return [Hash{Symbol => Float}] :without, :with and :hand (median jobs/s), :ratio
    #   (with / without), :peer (with / sidekiq-unique-jobs' figure) and :hand_ratio (the
    #   gem's drain seconds / the hand-written guard's, median of the rounds' ratios)
    # @raise [RuntimeError] when a run fails, times out or records the wrong outcome
    def run
      SidekiqGuard.create_table(@db.connect)
      runs = MODES.keys.to_h { |mode| [mode, []] }
      @repeats.times do |r|
        MODES.keys.rotate(r).each { |mode| runs[mode] << once(mode, "#{r}#{mode}") }
      end
      figures = summarise(runs)
      report(figures, runs)
      figures
    end

    private

    def summarise(runs)
      rates = runs.transform_values { |list| list.map { |f| f["jobs"] / f["seconds"] } }
      figures = rates.transform_values { |list| Stats.median(list) }
      figures[:ratio] = Stats.median(rates[:with].zip(rates[:without]).map { |w, wo| w / wo })
      figures[:hand_ratio] = Stats.median(runs[:with].zip(runs[:hand]).map { |w, h| w["seconds"] / h["seconds"] })
      figures[:peer] = figures[:with] / PEER_JOBS_PER_S
      figures
    end

    # @return [Hash] the run's figures (sidekiq_boot.rb's, with "wal" and "commits": WAL
    #   bytes and transaction ids over the run, "server_cpu": PostgreSQL's CPU seconds, or
    #   nil where it cannot be read)
    def once(mode, id)
      prefix = "r#{Process.pid}-#{id}-"
      enqueue(prefix)
      result = File.join(@dir, "sidekiq-#{id}.json")
      FileUtils.rm_f(result)
      log = File.join(@dir, "sidekiq-#{id}.log")
      figures = measured { work(mode, result, log) }
      check(mode, prefix, figures, log)
      say(mode, figures)
      figures
    end

    # Runs the block (one sidekiq run) and adds the server's counters over it to the
    # figures the block returns.
    # @return [Hash] the block's figures with "server_cpu", "hot", "wal", "commits" and,
    #   with pg_stat_statements, "server_ms" and "statements"
    def measured
      server = server_reset
      before = @db.counters
      updates_before = updates
      since = @db.server_now
      cpu_before = @db.server_cpu_seconds
      figures = yield
      figures["server_cpu"] = server_cpu(since, cpu_before)
      after = @db.counters
      figures["hot"] = hot_ratio(updates_before, updates)
      figures["wal"] = after[:wal_bytes] - before[:wal_bytes]
      figures["commits"] = after[:writes] - before[:writes]
      figures.merge!("server_ms" => server_ms, "statements" => statements) if server
      figures
    end

    # @return [Float, nil] PostgreSQL's CPU seconds since `cpu_before`, once the sessions
    #   opened since `since` (sidekiq's) have ended; nil when not measurable
    def server_cpu(since, cpu_before)
      return nil unless cpu_before && @db.wait_for_sessions(since)

      @db.server_cpu_seconds - cpu_before
    end

    # Row updates of the gem's record table and the hand-written guard's (the mode that
    # runs writes one of them), from the statistics the server keeps: sidekiq has exited
    # when they are read after a run, so its connections have reported theirs.
    # @return [Array(Integer, Integer)] rows updated, of which HOT (heap-only: no index entry)
    def updates
      row = @db.exec("SELECT /* bench-counter */ coalesce(sum(n_tup_upd), 0)::bigint AS upd, " \
                     "coalesce(sum(n_tup_hot_upd), 0)::bigint AS hot FROM pg_stat_user_tables " \
                     "WHERE relname IN ('idempotent_job_records', '#{SidekiqGuard::TABLE}')").first
      [row["upd"].to_i, row["hot"].to_i]
    end

    # @return [Float, nil] the share of a run's row updates that were HOT (nil: none)
    def hot_ratio(before, after)
      updated = after[0] - before[0]
      updated.positive? ? (after[1] - before[1]).to_f / updated : nil
    end

    # Starts pg_stat_statements afresh for a run ({ServerTimes#reset}).
    # @return [Boolean] false when it cannot be reset here
    def server_reset
      ServerTimes.new(@db).reset
    end

    # @return [Float] the server's execution milliseconds of every statement since
    #   {#server_reset}, the benchmark's own reads excluded
    def server_ms
      @db.exec("SELECT /* bench-counter */ coalesce(sum(total_exec_time), 0)::float8 FROM pg_stat_statements " \
               "WHERE query NOT LIKE '%bench-counter%' AND query NOT LIKE '%pg_stat_statements%'").getvalue(0, 0).to_f
    end

    # @return [Array<Array(String, Integer, Float, Integer)>] every statement since
    #   {#server_reset} (the benchmark's own reads excluded): its text's first 90
    #   characters, calls, execution milliseconds and WAL bytes (its own records; the
    #   commit record is not counted there)
    def statements
      @db.exec("SELECT /* bench-counter */ query, calls, total_exec_time, wal_bytes FROM pg_stat_statements " \
               "WHERE query NOT LIKE '%bench-counter%' AND query NOT LIKE '%pg_stat_statements%'").map do |row|
        [row["query"].gsub(/\s+/, " ")[0, 90], row["calls"].to_i, row["total_exec_time"].to_f, row["wal_bytes"].to_i]
      end
    end

    def say(mode, figures)
      puts "   #{LABELS[mode]}: #{figures["jobs"]} jobs (#{@operations} operations + #{@duplicates} duplicates) " \
           "in #{figures["seconds"].round(2)} s, #{(figures["jobs"] / figures["seconds"]).round} jobs/s; effects run " \
           "#{figures["effects"]}; #{figures["deferred"]} deferred; #{costs_text(figures)}"
    end

    # @return [String] a run's costs per operation and per job, for the progress lines
    def costs_text(figures)
      "per operation #{per_op(figures, "wal").round} WAL bytes, #{per_op(figures, "commits").round(2)} write " \
        "commits; worker CPU #{(figures["cpu"] * 1e6 / figures["jobs"]).round} µs per job, server execution " \
        "#{(figures["server_ms"].to_f * 1e3 / @operations).round} µs per operation, PostgreSQL CPU " \
        "#{Format.num(figures["server_cpu"] && (figures["server_cpu"] * 1e6 / @operations))} µs per operation; " \
        "HOT updates #{figures["hot"] ? "#{(figures["hot"] * 100).round} %" : "–"}"
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
      env = { "BENCH_MIDDLEWARE" => MODES.fetch(mode), "BENCH_JOBS" => @jobs.to_s, "BENCH_RESULT" => result,
              "BENCH_CONCURRENCY" => CONCURRENCY.to_s }
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
      return check_without(figures, log) if mode == :without

      unless figures["effects"] == @operations && figures["most"] == 1
        raise "#{LABELS[mode]}: #{figures["effects"]} effects ran for #{@operations} operations " \
              "(most for one: #{figures["most"]}; log: #{log})"
      end
      completed = @db.exec(COMPLETED.fetch(mode), ["#{prefix}%"]).getvalue(0, 0).to_i
      raise "#{LABELS[mode]}: #{completed} of #{@operations} operations recorded completed (log: #{log})" unless
        completed == @operations
    end

    # Counts a run's completed records, by mode (operation keys LIKE $1).
    COMPLETED = {
      with: "SELECT count(*) FROM idempotent_job_records WHERE job_type = 'BenchNoopJob' " \
            "AND status = 'completed' AND operation_key LIKE $1",
      hand: "SELECT count(*) FROM #{SidekiqGuard::TABLE} WHERE job_type = 'BenchNoopJob' " \
            "AND completed_at IS NOT NULL AND operation_key LIKE $1"
    }.freeze

    def check_without(figures, log)
      return if figures["effects"] == @jobs

      raise "without a guard #{figures["effects"]} effects ran for #{@jobs} jobs (log: #{log})"
    end

    # @return [Float] a counter of the run per operation
    def per_op(figures, name)
      figures[name].to_f / @operations
    end

    def report(figures, runs)
      record(figures, runs)
      rows = MODES.keys.map { |mode| row(mode, figures, runs[mode]) }
      rows << ["sidekiq-unique-jobs 7.1.33, until_executed (issue 14, not re-run)", "–", Format.num(PEER_JOBS_PER_S),
               "–", "–", "1.00×", "", "", "", "", "", "", "", "", ""]
      @results.table("sidekiq", title, ["worker", "drain s (median)", "jobs/s (median)", "× no guard",
                                        "× hand-written (drain)", "× peer", "effects run",
                                        "WAL B / operation", "write commits / operation", "worker CPU µs / job",
                                        "server execution µs / operation", "PostgreSQL CPU µs / operation",
                                        "HOT updates (median)", "each run (s)",
                                        "target"],
                     rows, notes:)
      statement_report(runs)
    end

    def row(mode, figures, list)
      seconds, wal, commits = medians(list)
      guarded = mode != :without
      [LABELS[mode], Format.num(seconds, 2), Format.num(figures[mode]),
       Format.ratio(figures[mode] / figures[:without]), HAND_CELLS.fetch(mode) { Format.ratio(figures[:hand_ratio]) },
       mode == :with ? Format.ratio(figures[:peer]) : "–", effects_text(list.last),
       guarded ? Format.num(wal) : "–", guarded ? Format.num(commits, 2) : "–",
       *cpu_medians(list).map { Format.num(_1) }, hot_cell(list),
       list.map { |f| f["seconds"].round(2) }.join(" "), mode == :with ? verdicts(figures) : ""]
    end

    # @return [String] the median share of the run's row updates that were HOT
    #   (`n_tup_hot_upd / n_tup_upd`), or "–" when the mode updated no row
    def hot_cell(list)
      hot = list.filter_map { |f| f["hot"] }
      hot.empty? ? "–" : "#{(Stats.median(hot) * 100).round} %"
    end

    # The "× hand-written" cell of the modes other than the gem's.
    HAND_CELLS = { without: "–", hand: "1.00×" }.freeze

    # @return [Array(Float, Float, Float)] median drain seconds, WAL bytes and write
    #   commits per operation of a mode's runs
    def medians(list)
      [Stats.median(list.map { |f| f["seconds"] }), Stats.median(list.map { |f| per_op(f, "wal") }),
       Stats.median(list.map { |f| per_op(f, "commits") })]
    end

    # @return [Array(Float, Float)] median worker CPU µs per job and server execution µs
    #   per operation of a mode's runs
    def cpu_medians(list)
      [Stats.median(list.map { |f| f["cpu"].to_f * 1e6 / f["jobs"] }),
       Stats.median(list.map { |f| f["server_ms"].to_f * 1e3 / @operations }),
       Stats.median(list.filter_map { |f| f["server_cpu"] && (f["server_cpu"] * 1e6 / @operations) })]
    end

    def verdicts(figures)
      [Format.verdict(figures[:hand_ratio] <= HAND_TARGET, "≤ #{Format.ratio(HAND_TARGET)} hand-written"),
       Format.verdict(figures[:peer] >= PEER_TARGET, "≥ #{Format.ratio(PEER_TARGET)} peer")].join("; ")
    end

    def record(figures, runs)
      { without: "without_middleware", with: "with_middleware", hand: "hand_written" }.each do |mode, subject|
        record_mode(subject, figures[mode], runs[mode], counted: mode != :without)
      end
      @results.add("sidekiq", "with_middleware", "ratio_to_without", figures[:ratio], "x")
      @results.add("sidekiq", "with_middleware", "ratio_to_peer", figures[:peer], "x",
                   "sidekiq-unique-jobs #{PEER_JOBS_PER_S.round} jobs/s (issue 14)")
      @results.add("sidekiq", "with_middleware", "drain_ratio_to_hand_written", figures[:hand_ratio], "x",
                   "median of the rounds' ratios of drain seconds")
    end

    def record_mode(subject, rate, list, counted:)
      seconds, wal, commits = medians(list)
      @results.add("sidekiq", subject, "jobs_per_s", rate, "1/s",
                   "runs: #{list.map { |f| (f["jobs"] / f["seconds"]).round }.join(" ")}")
      @results.add("sidekiq", subject, "drain_seconds", seconds, "s")
      cpu, server, server_cpu = cpu_medians(list)
      @results.add("sidekiq", subject, "worker_cpu_per_job", cpu, "us", "the sidekiq process's CPU time, every thread")
      @results.add("sidekiq", subject, "server_exec_per_operation", server, "us", "pg_stat_statements total_exec_time")
      @results.add("sidekiq", subject, "server_cpu_per_operation", server_cpu, "us",
                   "every PostgreSQL process's CPU time, process start to exit")
      return unless counted

      @results.add("sidekiq", subject, "wal_bytes_per_operation", wal, "bytes")
      hot = list.filter_map { |f| f["hot"] }
      return if hot.empty?

      @results.add("sidekiq", subject, "hot_update_share", Stats.median(hot), "ratio",
                   "n_tup_hot_upd / n_tup_upd of the run's table")
      @results.add("sidekiq", subject, "write_commits_per_operation", commits, "count")
    end

    def title
      "5. A real sidekiq process (Sidekiq #{::Sidekiq::VERSION}, -c #{CONCURRENCY}, Redis, durable PostgreSQL): " \
        "#{@operations} operations + #{@duplicates} duplicates (#{@jobs} no-op jobs), no guard, the gem, " \
        "a hand-written guard"
    end

    def effects_text(figures)
      return "–" unless figures

      "#{figures["effects"]} (#{figures["once"]} once, most #{figures["most"]}; #{figures["deferred"]} deferred)"
    end

    def notes
      ["jobs queued first, each duplicate #{gap}–#{gap * 3} pushes behind its original; timed from the first " \
       "job's start to the last one's end; the three modes rotate (each round starts one further on); " \
       "jobs/s counts every job (operations and duplicates); × hand-written: the median of the rounds' ratios " \
       "of drain seconds.",
       "the gem: each operation claimed and completed (durable commits, heartbeat on, pool " \
       "#{CONCURRENCY + 5}), each duplicate turned away (one read-only statement, its count batched). " \
       "Hand-written guard: a Sidekiq server middleware with the pg gem and a narrow table of its own " \
       "(#{SidekiqGuard::TABLE}: key, token, lease end, completion time), named prepared statements, " \
       "durable commits, a pool of #{CONCURRENCY} connections; a duplicate re-reads its record (a second " \
       "statement). With either guard a duplicate that meets a live claim is re-scheduled and comes back " \
       "(Sidekiq's scheduled poll every #{SCHEDULED_POLL} s); checked: every operation's effect ran once and " \
       "its record is completed. Without a guard every job's effect runs (#{@jobs}).",
       "WAL B / write commits per operation: WAL insert position and transaction ids assigned over the run " \
       "(process start to exit), divided by the #{@operations} operations; worker CPU: the sidekiq process's " \
       "CPU time (every thread) from the first job's start to the last one's end, per job; server execution: " \
       "pg_stat_statements' total_exec_time of the run (parse, plan, executor start-up and commit excluded) " \
       "per operation; PostgreSQL CPU: every server process's user + system time (/proc, the sessions' once " \
       "they ended), process start to exit, per operation; " \
       "medians of the runs.",
       "× peer: against sidekiq-unique-jobs 7.1.33 (until_executed) on the same workload, #{PEER_JOBS_PER_S.round} " \
       "jobs/s worker side, measured for issue 14 on a quiet machine of this kind; that gem is not installable " \
       "here (no RubyGems), so it is a recorded figure, not a run beside ours.",
       "Sidekiq's own job logging (info) goes to a log file in every mode."]
    end
  end
end
