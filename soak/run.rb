# frozen_string_literal: true

# The soak and chaos run's driver: `ruby soak/run.rb [options]`, started by bin/soak,
# which provides PostgreSQL and Redis (DATABASE_URL, REDIS_URL, SOAK_PG_DATA, PG_BIN).
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "optparse"
require "fileutils"
require "securerandom"
require "set"
require "uri"
require "pg"
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "sidekiq/api"
require "idempotent_job/sidekiq"
require_relative "jobs"
require_relative "journal"
require_relative "worker"
require_relative "plan"
require_relative "producer"
require_relative "fleet"
require_relative "chaos"
require_relative "operator"
require_relative "evidence"
require_relative "checker"
require_relative "log_scan"
require_relative "report"

# See soak/jobs.rb.
module Soak
  # @return [Float] seconds on the monotonic clock
  def self.monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # The run: prepares a fresh database and Redis, starts the stand-in and the workers,
  # enqueues the plan while the chaos kills workers and restarts PostgreSQL, waits for
  # the queues to drain, lets the operator settle held operations, stops everything,
  # checks, and reports.
  class Run
    # The run's settings (see {parse}).
    Options = Struct.new(:seconds, :operations, :duplicates, :workers, :threads, :lease, :kill_every,
                         :drain_seconds, :work_ms, :seed, :out, :control, keyword_init: true)
    # Defaults: the short run of bin/test.
    DEFAULTS = { seconds: 60, operations: 1500, duplicates: 0.3, workers: 3, threads: 5, lease: 6, kill_every: 5,
                 drain_seconds: 180, work_ms: 200, out: "tmp/soak", control: false }.freeze
    # The soak's own database, created afresh on the server of DATABASE_URL.
    DATABASE = "idempotent_job_soak"
    # Progress lines during the run: about this many, at least 10 s apart.
    PROGRESS_LINES = 40

    # The command-line options: name, argument, type, description (the default is appended).
    FLAGS = [
      [:seconds, "N", Float, "length of the enqueue and chaos phase, seconds"],
      [:operations, "M", Integer, "distinct operations"],
      [:duplicates, "F", Float, "share of all deliveries that are duplicates, 0 <= F < 1"],
      [:workers, "N", Integer, "sidekiq processes"],
      [:threads, "N", Integer, "Sidekiq concurrency of each process"],
      [:lease, "S", Float, "lease of every claim, seconds"],
      [:kill_every, "S", Float, "mean seconds between SIGKILLs of a random worker, 0 for none"],
      [:drain_seconds, "S", Float, "longest wait for the queues to drain, seconds"],
      [:work_ms, "MS", Integer, "longest pause of a job body before and again after its effect, ms"],
      [:seed, "N", Integer, "random seed"],
      [:out, "DIR", String, "where the logs and report.txt go"],
      [:control, nil, TrueClass, "the control run: the same without the gem's middleware (must find violations)"]
    ].freeze

    # @param argv [Array<String>] the options (consumed)
    # @return [Options]
    # @raise [OptionParser::ParseError] for a bad option
    def self.parse(argv)
      options = Options.new(**DEFAULTS, seed: Random.new_seed % 1_000_000)
      OptionParser.new do |parser|
        parser.banner = "usage: bin/soak [options]   (docs/soak.md)"
        FLAGS.each do |name, argument, type, description|
          default = DEFAULTS.fetch(name, "random, printed")
          parser.on("--#{name.to_s.tr("_", "-")} #{argument}".strip, type, "#{description} (#{default})") do |value|
            options[name] = value
          end
        end
      end.parse!(argv)
      options
    end

    # @param options [Options]
    # @param argv [Array<String>] the command line, for the report
    def initialize(options, argv)
      @o = options
      @command = "bin/soak #{argv.join(" ")}".strip
      @random = Random.new(options.seed)
      @timings = {}
      @problems = []
    end

    # @return [Integer] the exit status: 0 when no violation was found
    def call
      prepare
      phase
      drained = drain
      finish(drained)
    ensure
      # Also after a failure: no thread may start a worker once the fleet is stopped.
      @producer&.stop
      @chaos&.stop
      @threads&.each { |thread| thread.join(30) }
      @fleet&.stop_all
      stop_stand_in
    end

    private

    def say(*lines)
      puts(*lines)
      $stdout.flush
    end

    def prepare
      FileUtils.rm_rf(@o.out)
      FileUtils.mkdir_p(File.join(@o.out, "logs"))
      database_url = prepare_database
      ::Sidekiq.redis(&:flushdb)
      start_stand_in
      @plan = Plan.new(operations: @o.operations, duplicates: @o.duplicates, seconds: @o.seconds, random: @random,
                       run: SecureRandom.hex(2))
      @fleet = Fleet.new(size: @o.workers, threads: @o.threads, dir: File.join(@o.out, "logs"),
                         env: worker_env(database_url))
      say "soak: #{@command} (seed #{@o.seed}); #{@plan.pushes.sum(&:copies)} deliveries of #{@o.operations} " \
          "operations planned; starting #{@o.workers} workers"
      @fleet.start_all
    end

    # A fresh database with the gem's schema and the ledger table.
    # @return [String] its URL
    def prepare_database
      database_url = fresh_database
      IdempotentJob.configure(database_url:, lease: @o.lease, logger: Logger.new(File.join(@o.out, "driver.log")))
      IdempotentJob.migrate!
      PG.connect(database_url) { |c| c.exec(LedgerJob::TABLE_SQL) }
      database_url
    end

    def worker_env(database_url)
      { "DATABASE_URL" => database_url, "REDIS_URL" => ENV.fetch("REDIS_URL"), "SOAK_STAND_IN" => @stand_in_address,
        "SOAK_LEASE" => @o.lease.to_s, "SOAK_WORK_MS" => @o.work_ms.to_s,
        "SOAK_CONTROL" => @o.control ? "1" : "0" }
    end

    # Drops and creates the soak's database on the server of DATABASE_URL.
    # @return [String] its URL
    def fresh_database
      server = ENV.fetch("DATABASE_URL")
      PG.connect(server) do |c|
        c.exec("SET client_min_messages = warning")
        c.exec("DROP DATABASE IF EXISTS #{DATABASE} WITH (FORCE)")
        c.exec("CREATE DATABASE #{DATABASE}")
      end
      URI(server).tap { |uri| uri.path = "/#{DATABASE}" }.to_s
    end

    def start_stand_in
      port_file = File.join(@o.out, "stand-in.port")
      log = File.join(@o.out, "logs", "stand-in.log")
      @stand_in_pid = Process.spawn("ruby", File.join(__dir__, "stand_in.rb"), port_file,
                                    File.join(@o.out, "effects.jsonl"), out: log, err: log, pgroup: true)
      deadline = Soak.monotonic + 20
      sleep 0.1 until File.exist?(port_file) || Soak.monotonic > deadline
      raise "the stand-in did not start (#{log})" unless File.exist?(port_file)

      @stand_in_address = "127.0.0.1:#{File.read(port_file)}"
      @stand_in = StandIn::Client.new(@stand_in_address)
    end

    def stop_stand_in
      return unless @stand_in_pid

      Process.kill(:TERM, @stand_in_pid)
      Process.wait(@stand_in_pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    ensure
      @stand_in_pid = nil
    end

    def phase
      @started = Soak.monotonic
      @timings[:started_at] = Time.now.to_f
      @producer = Producer.new(@plan)
      @postgres = Postgres.new(data_dir: ENV.fetch("SOAK_PG_DATA"), pg_bin: ENV.fetch("PG_BIN"),
                               log: File.join(@o.out, "logs", "postgresql.log"))
      @chaos = Chaos.new(fleet: @fleet, postgres: @postgres, random: @random, kill_every: @o.kill_every,
                         seconds: @o.seconds) { |line| say "soak: #{line}" }
      @threads = [Thread.new { @producer.run(@started) }, Thread.new { @chaos.run(@started) }]
      watch(@threads)
      @producer.stop
      @chaos.stop
      @threads.each(&:join)
      @fleet.fill
      @timings[:phase] = Soak.monotonic - @started
    end

    # Prints progress until the phase's end; raises what a thread raised.
    def watch(threads)
      every = [10, (@o.seconds / PROGRESS_LINES).round(-1)].max
      next_line = @started + every
      while Soak.monotonic < @started + @o.seconds || threads.first.alive?
        threads.each { |t| t.join(0) } # re-raises a thread's exception here
        @fleet.reap
        if Soak.monotonic >= next_line
          progress
          next_line += every
        end
        sleep 0.2
      end
    end

    def progress
      waiting = pending.map { |what, n| "#{what} #{n}" }.join(", ")
      say format("soak: %<t>3.0f s: enqueued %<done>d/%<all>d deliveries; %<records>s; %<kills>d kills; %<waiting>s",
                 t: Soak.monotonic - @started, done: @producer.total, all: @plan.pushes.sum(&:copies),
                 records: record_counts, kills: @fleet.kills.size, waiting:)
    end

    def record_counts
      PG.connect(IdempotentJob.configuration.database_url, connect_timeout: 2) do |c|
        rows = c.exec("SELECT status, count(*) FROM idempotent_job_records GROUP BY status ORDER BY status").values
        "records: #{rows.map { |status, n| "#{status} #{n}" }.join(", ")}"
      end
    rescue PG::Error => e
      "records: database unreachable (#{e.message.lines.first&.strip})"
    end

    # @return [Hash{String => Integer}] deliveries waiting or in hand
    def pending
      { "queued" => ::Sidekiq::Queue.new(QUEUE).size, "scheduled" => ::Sidekiq::ScheduledSet.new.size,
        "retrying" => ::Sidekiq::RetrySet.new.size, "in hand" => ReliableFetch.in_hand(@fleet.running.map(&:id)) }
    end

    # Waits for the queues to drain, lets the operator settle held operations, waits again.
    # @return [Boolean] false when the queues did not drain in time
    def drain
      started = Soak.monotonic
      deadline = started + @o.drain_seconds
      late = @fleet.sweep_killed
      say "soak: #{late} deliveries found late in killed workers' lists, re-enqueued" if late.positive?
      drained = wait_drained(deadline)
      if drained
        @resolutions = Operator.new(@stand_in).resolve_held
        say "soak: the operator settled #{@resolutions.size} held operations" unless @resolutions.empty?
        drained = wait_drained(deadline) unless @resolutions.empty?
      end
      @resolutions ||= {}
      @timings[:drain] = Soak.monotonic - started
      drained
    end

    def wait_drained(deadline)
      quiet = 0
      until quiet >= 3
        @fleet.reap
        quiet = pending.values.sum.zero? ? quiet + 1 : 0
        if Soak.monotonic > deadline
          @problems << "the queues did not drain within #{@o.drain_seconds.round} s: #{pending}"
          return false
        end
        sleep 0.5
      end
      true
    end

    def finish(drained)
      check_started = Soak.monotonic
      @fleet.stop_all
      dead = ::Sidekiq::DeadSet.new.size
      @problems << "#{dead} deliveries in Sidekiq's dead set (retries exhausted)" if dead.positive?
      @problems << "the queues did not drain" unless drained || @problems.any?
      report = Report.new(facts)
      @timings[:check] = Soak.monotonic - check_started
      @timings[:total] = Soak.monotonic - @started
      File.write(File.join(@o.out, "report.txt"), "#{report}\n")
      say "", report.to_s(limit: Report::LIST_LIMIT), "",
          "report: #{File.join(@o.out, "report.txt")}; logs: #{File.join(@o.out, "logs")}"
      report.violations.empty? ? 0 : 1
    end

    def facts
      evidence = gather_evidence
      Report::Facts.new(
        command: @command, control: @o.control, versions:, timings: @timings, plan: @plan, producer: @producer,
        fleet: @fleet, postgres: @postgres, counts: Journal.counts, evidence:,
        checker: Checker.new(@plan, evidence, @resolutions),
        log_scan: LogScan.new(@postgres.restarts).scan(@fleet.logs), resolutions: @resolutions, problems: @problems
      )
    end

    def gather_evidence
      PG.connect(IdempotentJob.configuration.database_url) do |c|
        c.type_map_for_results = PG::BasicTypeMapForResults.new(c)
        Evidence.new(records: records(c), ledger: c.exec(LEDGER_SQL).values.to_h, calls: @stand_in.calls,
                     journal: Journal.entries, chaos: @chaos)
      end
    end

    # Every idempotency record of the soak's jobs.
    RECORDS_SQL = <<~SQL
      SELECT job_type, operation_key, status, claim_token::text, attempts, takeovers, duplicates, last_claim,
             resolution, last_error, held_at, given_up_at, claimed_at,
             round(greatest(0, EXTRACT(EPOCH FROM now() - lease_expires_at)))::int AS lease_expired_for
        FROM idempotent_job_records
    SQL
    # Ledger rows per operation key.
    LEDGER_SQL = "SELECT operation_key, count(*)::int FROM soak_ledger GROUP BY operation_key"

    def records(connection)
      connection.exec(RECORDS_SQL).to_a.to_h { |row| [Soak.reference(row["job_type"], row["operation_key"]), row] }
    end

    def versions
      server = PG.connect(IdempotentJob.configuration.database_url) { |c| c.exec("SHOW server_version").getvalue(0, 0) }
      redis = ::Sidekiq.redis { |r| r.info["redis_version"] }
      "PostgreSQL #{server[/\A[\d.]+/]}, Redis #{redis}"
    end
  end
end

if $PROGRAM_NAME == __FILE__
  begin
    argv = ARGV.dup
    exit Soak::Run.new(Soak::Run.parse(ARGV), argv).call
  rescue OptionParser::ParseError => e
    warn "bin/soak: #{e.message} (bin/soak --help)"
    exit 2
  rescue Interrupt
    exit 130
  end
end
