# frozen_string_literal: true

require "English"
require "etc"
require "json"

module IdempotentJobBench
  # Issue 31's "one database's ceiling": PROCESSES worker processes of THREADS threads
  # each drive deliveries with no job body (new operations: claim + completion; every
  # fourth a duplicate of one finished earlier) as fast as one PostgreSQL answers, for a
  # few seconds per variant: the gem's Ruby door (`IdempotentJob.perform_once`), a
  # hand-written pg guard in Ruby, the Python door (`idempotent_job.perform_once`,
  # bench/ceiling_worker.py) and a hand-written psycopg guard; the variants rotate each
  # round. Target: each door's deliveries per second >= 0.8x its language's guard's.
  class Ceiling
    ROOT = File.expand_path("..", __dir__)
    GUARD_TABLE = "bench_ceiling_guard"
    VARIANTS = %w[ruby_door ruby_guard python_door python_guard].freeze
    LABELS = { "ruby_door" => "Ruby door: IdempotentJob.perform_once",
               "ruby_guard" => "hand-written guard, Ruby pg",
               "python_door" => "Python door: idempotent_job.perform_once",
               "python_guard" => "hand-written guard, Python psycopg" }.freeze

    # @param db [Database]
    # @param results [Results]
    # @param plan [Array(Integer, Integer, Float, Integer)] worker processes per variant,
    #   threads per process, seconds per variant and round, rounds
    def initialize(db, results, plan)
      @db = db
      @results = results
      @processes, @threads, @seconds, @rounds = plan
    end

    # Runs the rounds and adds the table. @raise [RuntimeError] when a worker fails
    def run
      raise "bin/python-ext failed" unless system(File.join(ROOT, "bin", "python-ext"))

      @db.exec("CREATE TABLE IF NOT EXISTS #{GUARD_TABLE} (key text PRIMARY KEY, token uuid NOT NULL, " \
               "lease_until timestamptz NOT NULL, done boolean NOT NULL DEFAULT false, completed_at timestamptz)")
      rates = VARIANTS.to_h { |v| [v, []] }
      costs = VARIANTS.to_h { |v| [v, []] }
      @rounds.times do |round|
        VARIANTS.rotate(round).each do |variant|
          rate, cost = once(variant, "c#{Process.pid}-#{round}-#{variant}")
          puts "   round #{round + 1}: #{LABELS[variant]}: #{rate.round} deliveries/s; per delivery: " \
               "#{cost_text(cost)}; load #{File.read("/proc/loadavg").split.first(3).join(" ")}"
          rates[variant] << rate
          costs[variant] << cost
        end
      end
      report(rates)
      cost_report(costs)
    end

    private

    # @return [Array(Float, Hash)] deliveries per second of one variant's processes
    #   together, and what a delivery cost ({#costs})
    def once(variant, prefix)
      language, mode = variant.split("_")
      before = snapshot
      since = @db.server_now
      workers = Array.new(@processes) do |i|
        command = worker(language, mode, "#{prefix}-#{i}")
        IO.popen(command)
      end
      figures = workers.map do |io|
        out = io.read
        io.close
        raise "ceiling worker #{variant} failed: #{out}" unless $CHILD_STATUS.success?

        JSON.parse(out.lines.last)
      end
      ops = figures.sum { |f| f["ops"] }
      [ops / Stats.median(figures.map { |f| f["seconds"] }), costs(before, snapshot(since), ops)]
    end

    # The counters a variant's cost is measured with, read once the sessions its workers
    # opened since `since` have ended (so their backends' CPU time is the postmaster's,
    # counted once); pg_stat_statements is reset for the next variant.
    # @return [Hash] :worker_cpu (seconds, the worker processes this one waited for),
    #   :server_cpu (seconds, {Database#server_cpu_seconds}), :wal_bytes, :writes,
    #   :statements (pg_stat_statements since the last snapshot: text => [calls, ms, WAL bytes])
    def snapshot(since = nil)
      raise "ceiling: the workers' sessions did not end" if since && !@db.wait_for_sessions(since)

      times = Process.times
      counters = @db.counters
      { worker_cpu: times.cutime + times.cstime, server_cpu: @db.server_cpu_seconds,
        wal_bytes: counters[:wal_bytes], writes: counters[:writes], statements: statements_and_reset }
    end

    # @return [Hash{String => Array(Integer, Float, Integer)}] each statement's calls,
    #   execution milliseconds and WAL bytes since the last reset ({} without
    #   pg_stat_statements); resets them
    def statements_and_reset
      return {} unless @db.statements?

      rows = @db.exec("SELECT /* bench-counter */ query, calls, total_exec_time, wal_bytes FROM pg_stat_statements " \
                      "WHERE query NOT LIKE '%bench-counter%' AND query NOT LIKE '%pg_stat_statements%'")
      @db.exec("SELECT /* bench-counter */ pg_stat_statements_reset()")
      rows.to_h do |row|
        [row["query"].gsub(/\s+/, " ")[0, 70], [row["calls"].to_i, row["total_exec_time"].to_f, row["wal_bytes"].to_i]]
      end
    end

    # @return [Hash] one variant's cost per delivery, µs and bytes: :worker_cpu, :server_cpu
    #   (nil when not measurable), :server_exec (pg_stat_statements), :wal, :commits, and
    #   :statements (text => [calls, execution ms, WAL bytes] of the run)
    def costs(before, after, ops)
      per = ->(key, scale = 1e6) { (after[key] - before[key]).to_f * scale / ops if after[key] && before[key] }
      { worker_cpu: per.call(:worker_cpu), server_cpu: per.call(:server_cpu), wal: per.call(:wal_bytes, 1),
        commits: per.call(:writes, 1), server_exec: after[:statements].sum { |_, (_, ms, _)| ms } * 1e3 / ops,
        statements: after[:statements], ops: }
    end

    def cost_text(cost)
      "worker CPU #{Format.num(cost[:worker_cpu])} µs, PostgreSQL CPU #{Format.num(cost[:server_cpu])} µs " \
        "(statements executing #{Format.num(cost[:server_exec])} µs), WAL #{Format.num(cost[:wal])} B, " \
        "#{Format.num(cost[:commits], 2)} write commits"
    end

    # @return [String] the door's verdict against its language's guard ("" for a guard)
    def target(variant, ratio)
      return "" unless variant.end_with?("door")

      @results.add("ceiling", variant, "ratio_to_guard", ratio, "x")
      "≥ 0.80× guard: #{ratio >= 0.8 ? "met" : "MISSED"}"
    end

    def worker(language, mode, prefix)
      if language == "python"
        [File.join(ROOT, ".venv", "bin", "python"), File.join(__dir__, "ceiling_worker.py"), mode, prefix,
         @threads.to_s, @seconds.to_s]
      else
        [RbConfig.ruby, File.join(__dir__, "ceiling_worker.rb"), mode, prefix, @threads.to_s, @seconds.to_s]
      end
    end

    # Adds the cost table (medians of the rounds) and the statements table (summed over them).
    def cost_report(costs)
      rows = VARIANTS.map { |variant| cost_row(variant, costs[variant]) }
      @results.table("ceiling", "What a delivery costs in the ceiling runs (medians of the rounds)",
                     ["variant", "worker CPU µs", "PostgreSQL CPU µs", "CPU µs in all", "cores ÷ CPU (deliveries/s)",
                      "statements executing µs", "WAL B", "write commits"], rows,
                     notes: ["per delivery (duplicates included); worker CPU: the worker processes' user + system " \
                             "time; PostgreSQL CPU: every server process's (backends, WAL writer, checkpointer) " \
                             "from /proc; cores ÷ CPU: the deliveries/s #{Etc.nprocessors} cores would allow if " \
                             "CPU were all a delivery waited for; statements executing: pg_stat_statements' " \
                             "total_exec_time (parse, plan and commit excluded); WAL: insert position"])
      statement_table(costs)
    end

    # The cost columns and records.
    COSTS = { worker_cpu: "us", server_cpu: "us", server_exec: "us", wal: "bytes", commits: "count" }.freeze

    # @return [Array<String>] a variant's row of the cost table (and its records added)
    def cost_row(variant, list)
      m = COSTS.to_h do |key, unit|
        value = Stats.median(list.filter_map { |c| c[key] })
        @results.add("ceiling", variant, "#{key}_per_delivery", value, unit)
        [key, value]
      end
      cpu = m[:worker_cpu].to_f + m[:server_cpu].to_f
      [LABELS[variant], Format.num(m[:worker_cpu]), Format.num(m[:server_cpu]), Format.num(cpu),
       Format.num(Etc.nprocessors * 1e6 / cpu), Format.num(m[:server_exec]), Format.num(m[:wal]),
       Format.num(m[:commits], 2)]
    end

    def statement_table(costs)
      rows = VARIANTS.flat_map { |variant| statement_rows(variant, costs[variant]) }
      @results.table("ceiling", "The ceiling runs' statements (pg_stat_statements, summed over the rounds)",
                     ["variant", "statement", "calls / delivery", "execution µs / call", "WAL B / call",
                      "execution µs / delivery"], rows,
                     notes: ["statements of at least one call per 100 deliveries; WAL B / call: the statement's " \
                             "own records (its commit record is not counted there)"])
    end

    # @return [Array<Array<String>>] a variant's statements, costliest first
    def statement_rows(variant, list)
      ops = list.sum { |c| c[:ops] }
      frequent = statement_sums(list).select { |_, (calls, _, _)| calls * 100 >= ops }
      frequent.sort_by { |_, (_, ms, _)| -ms }.map do |q, (calls, ms, wal)|
        [LABELS[variant], q, Format.num(calls.to_f / ops, 3), Format.num(ms * 1e3 / calls),
         Format.num(wal.to_f / calls), Format.num(ms * 1e3 / ops)]
      end
    end

    # @return [Hash{String => Array(Integer, Float, Integer)}] calls, execution ms and WAL
    #   bytes per statement text, summed over a variant's rounds
    def statement_sums(list)
      sums = Hash.new { |h, k| h[k] = [0, 0.0, 0] }
      list.each { |c| c[:statements].each { |q, v| sums[q] = sums[q].zip(v).map(&:sum) } }
      sums
    end

    def report(rates)
      medians = rates.transform_values { |list| Stats.median(list) }
      rows = VARIANTS.map do |variant|
        ratio = medians[variant] / medians["#{variant.split("_").first}_guard"]
        @results.add("ceiling", variant, "deliveries_per_s", medians[variant], "1/s",
                     "rounds: #{rates[variant].map(&:round).join(" ")}")
        [LABELS[variant], medians[variant].round, rates[variant].map(&:round).join(" "), Format.ratio(ratio),
         target(variant, ratio)]
      end
      @results.table("ceiling", "One database's ceiling: #{@processes} processes × #{@threads} threads per variant, " \
                                "no job body, 25 % duplicates, #{@seconds} s per variant and round, " \
                                "#{@rounds} rounds (variants rotate)",
                     ["variant", "deliveries/s (median)", "each round", "× its language's guard", "target"], rows,
                     notes: ["durable commits; the gem: claim + completion per new operation, one read-only " \
                             "statement per duplicate (its count batched); the guards: INSERT … ON CONFLICT DO " \
                             "NOTHING RETURNING + UPDATE, a duplicate reads its row; on a 2-core machine the " \
                             "workers and PostgreSQL share the cores"])
    end
  end
end
