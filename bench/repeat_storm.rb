# frozen_string_literal: true

# The repeat bookkeeping under a duplicate storm (issue 25), run by bin/repeat-storm:
#
#   ruby bench/repeat_storm.rb [--processes 4] [--threads 8] [--duplicates 102400]
#                              [--operations 64] [--kills 8] [--pg-log FILE]
#
# 1. Storm: PROCESSES forked processes × THREADS threads answer DUPLICATES duplicates
#    (perform_once of completed operations): half of them of one operation every thread
#    shares, half of OPERATIONS operations every thread draws from in its own random
#    order (so concurrent batches meet the same rows in different orders). Then each
#    process calls settle_repeats. Prints every duplicate answered against the
#    record's `duplicates`, PostgreSQL's deadlock count (pg_stat_database, and
#    "deadlock detected" lines in its log when --pg-log names it), settle_repeats
#    errors, and a duplicate's latency (p50, p99, max).
# 2. Kills: KILLS times, one process × THREADS threads answers duplicates until it is
#    SIGKILLed (no settle_repeats, no at_exit): prints the counts lost (answered minus
#    counted) and the same in milliseconds of that process's duplicate rate.
#
# Needs DATABASE_URL (any database: each run uses job types of its own) and the built
# extension (rake compile). IDEMPOTENT_JOB_LIB=DIR loads the gem from DIR instead of
# lib/ (another build, to compare). Asserts nothing: it prints figures (docs/design.md,
# "Repeat bookkeeping: what a crash can lose").
$LOAD_PATH.unshift(ENV.fetch("IDEMPOTENT_JOB_LIB") { File.expand_path("../lib", __dir__) })
require "json"
require "logger"
require "optparse"
require "pg"
require "securerandom"
require "idempotent_job"
require_relative "support"

module IdempotentJobBench
  # The storm and kill measurements of the repeat bookkeeping.
  class RepeatStorm
    Clock = IdempotentJobBench::Clock
    Stats = IdempotentJobBench::Stats

    def initialize(argv)
      @processes = 4
      @threads = 8
      @duplicates = 102_400
      @operations = 64
      @kills = 8
      @pg_log = nil
      OptionParser.new do |o|
        o.on("--processes N", Integer) { |v| @processes = v }
        o.on("--threads N", Integer) { |v| @threads = v }
        o.on("--duplicates N", Integer, "duplicates in all (split evenly)") { |v| @duplicates = v }
        o.on("--operations N", Integer, "overlapping operations besides the shared one") { |v| @operations = v }
        o.on("--kills N", Integer, "SIGKILL trials (0: none)") { |v| @kills = v }
        o.on("--pg-log FILE", "PostgreSQL's log, searched for deadlock detected") { |v| @pg_log = v }
      end.parse!(argv)
      @url = ENV.fetch("DATABASE_URL")
    end

    # @return [Integer] 0
    def run
      $stdout.sync = true
      configure
      IdempotentJob.migrate!
      storm
      kills if @kills.positive?
      0
    end

    private

    def configure
      IdempotentJob.reset!
      IdempotentJob.configure(database_url: @url, pool_size: @threads + 2, logger: Logger.new(nil))
    end

    def sql(query, *params)
      conn = PG.connect(@url)
      conn.exec_params(query, params).to_a
    ensure
      conn&.close
    end

    # Completes `keys` of `job_type` (their first claims), so every later delivery is a
    # duplicate answered by the read-only look and counted by the bookkeeping.
    def complete(job_type, keys)
      keys.each { |k| IdempotentJob.perform_once(job_type, k) { nil } }
      IdempotentJob.settle_repeats
    end

    def counted(job_type)
      sql("SELECT operation_key, duplicates FROM idempotent_job_records WHERE job_type = $1", job_type)
        .to_h { |r| [r["operation_key"], Integer(r["duplicates"])] }
    end

    def deadlocks
      sleep 1 # the backends of exited workers report their statistics as they end
      Integer(sql("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
                .first["deadlocks"])
    end

    def log_deadlocks(from)
      return nil unless @pg_log && File.exist?(@pg_log)

      File.open(@pg_log) do |f|
        f.seek(from)
        f.each_line.count { |l| l.include?("deadlock detected") }
      end
    end

    # One worker process: THREADS threads answer `per_thread` duplicates each, then
    # settle_repeats; writes a JSON report to `out`.
    def storm_worker(job_type, keys, per_thread, out)
      configure # this process's own pool
      results = Array.new(@threads) { Thread.new { storm_thread(job_type, keys, per_thread) } }.map(&:value)
      answered = Hash.new(0)
      results.each { |counts, _| counts.each { |k, n| answered[k] += n } }
      settle_error = begin
        IdempotentJob.settle_repeats
        nil
      rescue IdempotentJob::Error => e
        "#{e.class}: #{e.message}"
      end
      out.puts(JSON.generate(answered:, latencies: results.flat_map(&:last), settle_error:))
    end

    # @return [Array(Hash{String => Integer}, Array<Float>)] duplicates answered per
    #   key, and each one's seconds
    def storm_thread(job_type, keys, per_thread)
      random = Random.new(SecureRandom.random_number(1 << 30))
      counts = Hash.new(0)
      latencies = Array.new(per_thread) do |i|
        key = i.even? ? "shared" : keys[random.rand(keys.size)]
        started = Clock.now
        outcome = IdempotentJob.perform_once(job_type, key) { raise "a duplicate ran its block" }
        raise "#{key}: #{outcome.decision}" unless outcome.decision == :completed

        counts[key] += 1
        Clock.now - started
      end
      [counts, latencies]
    end

    def storm
      job_type = "RepeatStorm-#{SecureRandom.hex(4)}"
      keys = Array.new(@operations) { |i| "op-#{i}" }
      complete(job_type, ["shared", *keys])
      per_thread = (@duplicates.to_f / (@processes * @threads)).ceil
      marks = { log: @pg_log && File.exist?(@pg_log) ? File.size(@pg_log) : 0, deadlocks: }
      started = Clock.now
      reports = fork_all(@processes) { |out| storm_worker(job_type, keys, per_thread, out) }
      report_storm(job_type, reports, Clock.now - started, marks)
    end

    def report_storm(job_type, reports, elapsed, marks)
      answered = Hash.new(0)
      reports.each { |r| r["answered"].each { |k, n| answered[k] += n } }
      puts "== repeat storm: #{@processes} processes × #{@threads} threads, #{answered.values.sum} duplicates " \
           "(half of 1 shared operation, half of #{@operations} overlapping), #{elapsed.round(1)} s"
      print_counts(answered, counted(job_type), reports.filter_map { |r| r["settle_error"] },
                   deadlocks: deadlocks - marks[:deadlocks], logged: log_deadlocks(marks[:log]))
      print_latency(reports.flat_map { |r| r["latencies"] }.map { |s| s * 1e3 }, elapsed)
    end

    def print_counts(answered, counts, errors, deadlocks:, logged:)
      total = answered.values.sum
      short = answered.count { |k, n| counts.fetch(k, 0) < n }
      puts "duplicates answered         #{total}"
      puts "duplicates counted          #{counts.values.sum}"
      puts "lost                        #{total - counts.values.sum} (#{short} operations short)"
      puts "deadlocks (pg_stat)         #{deadlocks}"
      puts "deadlock detected (log)     #{logged || "– (no --pg-log)"}"
      puts "settle_repeats errors       #{errors.size}#{errors.empty? ? "" : ": #{errors.uniq.join("; ")}"}"
    end

    def print_latency(latencies, elapsed)
      puts format("duplicate latency, ms      p50 %<p50>.2f  p99 %<p99>.2f  max %<max>.1f",
                  p50: Stats.percentile(latencies, 0.5), p99: Stats.percentile(latencies, 0.99), max: latencies.max)
      puts format("throughput                 %<rate>.0f duplicates/s", rate: latencies.size / elapsed)
    end

    # Forks `count` children running the block with a pipe; returns their JSON reports.
    def fork_all(count)
      children = Array.new(count) do
        reader, writer = IO.pipe
        pid = fork do
          reader.close
          yield writer
          writer.close
          exit!(0)
        rescue Exception => e # rubocop:disable Lint/RescueException -- report anything to the parent
          writer.puts(JSON.generate(error: "#{e.class}: #{e.message}"))
          exit!(1)
        end
        writer.close
        [pid, reader]
      end
      children.map do |pid, reader|
        report = JSON.parse(reader.read)
        reader.close
        Process.wait(pid)
        raise "worker #{pid}: #{report["error"]}" if report["error"]

        report
      end
    end

    # One process × THREADS threads answer duplicates of `keys` until SIGKILLed; one byte
    # down `out` per duplicate answered (written after its answer: the parent's count may
    # miss a few answered at the kill, never count one not answered).
    def kill_worker(job_type, keys, out)
      configure
      mutex = Mutex.new
      threads = Array.new(@threads) do
        Thread.new do
          random = Random.new(SecureRandom.random_number(1 << 30))
          loop do
            key = keys[random.rand(keys.size)]
            IdempotentJob.perform_once(job_type, key) { raise "a duplicate ran its block" }
            mutex.synchronize { out.write("x") }
          end
        end
      end
      threads.each(&:join)
    end

    def kills
      keys = Array.new([@operations, 200].min) { |i| "op-#{i}" }
      rows = Array.new(@kills) { kill_trial(keys) }
      lost = rows.map(&:first)
      ms = rows.map(&:last)
      puts "== SIGKILL during a duplicate storm: 1 process × #{@threads} threads, #{@kills} kills"
      puts "counts lost per kill        #{lost.sort.join(" ")}"
      puts "ms of duplicates per kill   #{ms.sort.map(&:round).join(" ")}"
      puts format("lost, ms of duplicates     median %<median>.0f  max %<max>.0f  (min %<min>.0f)",
                  median: Stats.median(ms), max: ms.max, min: ms.min)
    end

    # @return [Array(Integer, Float)] counts lost, and that in ms of the process's rate
    def kill_trial(keys)
      job_type = "RepeatKill-#{SecureRandom.hex(4)}"
      complete(job_type, keys)
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        writer.sync = true
        kill_worker(job_type, keys, writer)
      end
      writer.close
      total, elapsed = read_until_killed(pid, reader)
      lost = total - counted(job_type).values.sum
      [lost, lost / (total / elapsed) * 1e3]
    end

    # Reads the worker's bytes for 1.5 to 2.5 s, SIGKILLs it, reads the rest.
    # @return [Array(Integer, Float)] duplicates answered, seconds from the first
    def read_until_killed(pid, reader)
      total = 0
      started = nil
      loop do
        total += reader.readpartial(4096).bytesize
        started ||= Clock.now
        break if Clock.now >= started + 1.5 + rand
      end
      Process.kill(:KILL, pid)
      total += reader.read.bytesize
      [total, Clock.now - started]
    ensure
      Process.kill(:KILL, pid) rescue nil # rubocop:disable Style/RescueModifier
      Process.wait(pid)
      reader.close
    end
  end
end

exit IdempotentJobBench::RepeatStorm.new(ARGV).run if $PROGRAM_NAME == __FILE__
