# frozen_string_literal: true

# The benchmark's entry point, run by bin/bench (which starts the services and builds
# the extension): `ruby bench/run.rb [--quick] [--only first,duplicate,...] [--out DIR]`.
# Needs DATABASE_URL (a throwaway database: it writes millions of rows) and, for the
# sidekiq section, REDIS_URL.
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "etc"
require "optparse"
require "time"
require_relative "support"
require_relative "latency"
require_relative "throughput"
require_relative "table_growth"
require_relative "sidekiq_run"
require_relative "memory"
require_relative "replay"
require_relative "enqueue"
require_relative "purge"
require_relative "targets"
require_relative "celery_run"
require_relative "door_runs"
require_relative "ceiling"

module IdempotentJobBench
  # Parses the options, runs the sections in order, prints the tables and writes
  # tmp/bench/results.csv and results.md.
  class CLI
    # Sections in the order they run.
    SECTIONS = %w[first duplicate throughput growth sidekiq ceiling memory replay enqueue purge celery sqs rust].freeze

    # Sizes of each section: full run, and --quick (a smoke run of a minute or so).
    PLANS = {
      full: { rounds: 60, batch: 8, threads: [1, 2, 5, 10, 25], seconds: 1.5, repeats: 5,
              sizes: [1_000, 100_000, 1_000_000, 10_000_000], growth_rounds: 30,
              operations: 10_000, sidekiq_repeats: 3, memory_runs: 3, enqueue_batch: 50,
              purge_sizes: [100_000, 800_000], purge_loaded: 200_000,
              celery_operations: 5_000, celery_rounds: 3, sqs_operations: 100, sqs_rounds: 9, rust_operations: 2_000,
              door_rounds: 5, ceiling: [4, 16, 10.0, 3] },
      quick: { rounds: 4, batch: 5, threads: [1, 2, 5, 10, 25], seconds: 0.3, repeats: 1,
               sizes: [1_000, 100_000], growth_rounds: 4, operations: 1_000, sidekiq_repeats: 1,
               memory_runs: 1, enqueue_batch: 5,
               purge_sizes: [2_000, 16_000], purge_loaded: 4_000,
               celery_operations: 200, celery_rounds: 1, sqs_operations: 30, sqs_rounds: 1, rust_operations: 100,
               door_rounds: 1, ceiling: [2, 8, 2.0, 1] }
    }.freeze

    # @param argv [Array<String>] command-line arguments
    # @raise [OptionParser::ParseError] for a bad option
    def initialize(argv)
      @plan = :full
      @only = SECTIONS
      @out = File.expand_path("../tmp/bench", __dir__)
      parser.parse!(argv)
    end

    # Runs the selected sections.
    # @return [Integer] exit status: 0
    # @raise [KeyError] when DATABASE_URL (or REDIS_URL for sidekiq) is missing
    def run
      $stdout.sync = true
      started = Clock.now
      db = Database.new(ENV.fetch("DATABASE_URL"))
      IdempotentJob.configure(database_url: db.url, logger: Gem::NULL_LOGGER)
      IdempotentJob.migrate!
      @results = Results.new
      load_before = load_average
      @only.each { |name| section(name, db) }
      Targets.new(@results).report
      puts "\n#{@results.report}\n\n"
      files = @results.write(@out, header(db, load_before, Clock.now - started))
      puts "written: #{files.join(", ")} (#{(Clock.now - started).round} s in all)"
      0
    end

    private

    def parser
      OptionParser.new do |o|
        o.banner = "usage: bin/bench [--quick] [--only #{SECTIONS.join(",")}] [--out DIR]"
        o.on("--quick", "tiny sizes: a smoke run of under a minute") { @plan = :quick }
        o.on("--only LIST", Array, "run only these sections (#{SECTIONS.join(", ")})") do |list|
          unknown = list - SECTIONS
          raise OptionParser::InvalidArgument, "unknown section(s) #{unknown.join(", ")}" unless unknown.empty?

          @only = SECTIONS & list
        end
        o.on("--out DIR", "where results.csv and results.md go (default tmp/bench)") { |d| @out = File.expand_path(d) }
      end
    end

    def plan
      PLANS.fetch(@plan)
    end

    def section(name, db)
      puts "-- #{name} ..."
      $stdout.flush
      elapsed = Clock.seconds { run_section(name, db) }
      @results.timing(name, elapsed)
      puts "-- #{name}: #{elapsed.round(1)} s"
    end

    def run_section(name, db)
      p = plan
      case name
      when "first", "duplicate" then Latency.new(db, @results, rounds: p[:rounds], batch: p[:batch]).public_send(name)
      when "throughput"
        Throughput.new(db, @results, threads: p[:threads], seconds: p[:seconds], repeats: p[:repeats]).run
      when "growth" then TableGrowth.new(db, @results, sizes: p[:sizes], rounds: p[:growth_rounds]).run
      when "sidekiq"
        SidekiqRun.new(db, @results, operations: p[:operations], repeats: p[:sidekiq_repeats], dir: @out).run
      when "memory" then Memory.new(db, @results, runs: p[:memory_runs]).run
      when "ceiling" then Ceiling.new(db, @results, p[:ceiling]).run
      else run_operations_section(name, db, p)
      end
    end

    # The sections of results, reject at enqueue, purge and celery.
    def run_operations_section(name, db, sizes)
      case name
      when "replay" then Replay.new(db, @results, rounds: sizes[:rounds], batch: sizes[:batch]).run
      when "enqueue" then EnqueueCost.new(db, @results, rounds: sizes[:rounds], batch: sizes[:enqueue_batch]).run
      when "purge" then Purge.new(db, @results, sizes: sizes[:purge_sizes], loaded: sizes[:purge_loaded]).run
      when "celery"
        CeleryRun.new(@results, operations: sizes[:celery_operations], rounds: sizes[:celery_rounds], dir: @out).run
      when "sqs", "rust"
        DoorRuns.new(@results, sqs: [sizes[:sqs_operations], sizes[:sqs_rounds]],
                               rust: [sizes[:rust_operations], sizes[:door_rounds]]).public_send(name)
      end
    end

    def load_average
      File.read("/proc/loadavg").split.first(3).join(" ")
    rescue SystemCallError
      "?"
    end

    def header(db, load_before, seconds)
      debian = File.exist?("/etc/debian_version") ? "Debian #{File.read("/etc/debian_version").strip}" : "?"
      ["Machine: #{Etc.nprocessors} cores, #{debian}, #{RUBY_DESCRIPTION}; PostgreSQL #{db.describe}.",
       "Run: #{Time.now.utc.iso8601}, `bin/bench#{" --quick" if @plan == :quick}" \
       "#{" --only #{@only.join(",")}" unless @only == SECTIONS}`, #{seconds.round} s; load average " \
       "#{load_before} before, #{load_average} after."].join("  \n")
    end
  end
end

if $PROGRAM_NAME == __FILE__
  begin
    cli = IdempotentJobBench::CLI.new(ARGV)
  rescue OptionParser::ParseError => e
    warn "bin/bench: #{e.message} (bin/bench --help)"
    exit 2
  end
  exit cli.run
end
