# frozen_string_literal: true

require "English"
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
      @rounds.times do |round|
        VARIANTS.rotate(round).each do |variant|
          rate = once(variant, "c#{Process.pid}-#{round}-#{variant}")
          puts "   round #{round + 1}: #{LABELS[variant]}: #{rate.round} deliveries/s"
          rates[variant] << rate
        end
      end
      report(rates)
    end

    private

    # @return [Float] deliveries per second of one variant's processes together
    def once(variant, prefix)
      language, mode = variant.split("_")
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
      figures.sum { |f| f["ops"] } / Stats.median(figures.map { |f| f["seconds"] })
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
