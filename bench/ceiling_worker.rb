# frozen_string_literal: true

# One Ruby worker process of the ceiling section (bench/ceiling.rb): THREADS threads drive
# deliveries with no job body for SECONDS and print {"ops": N, "seconds": S} as JSON.
#
#   ruby bench/ceiling_worker.rb door|guard PREFIX THREADS SECONDS
#
# Every fourth delivery repeats an operation the thread finished earlier. door:
# IdempotentJob.perform_once (a pool of THREADS connections, no log lines); guard: a hand-written pg
# guard on bench_ceiling_guard, one connection per thread, durable commits.

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "json"
require "logger"
require "pg"
require "idempotent_job"

mode, prefix, threads, seconds = ARGV
threads = Integer(threads)
seconds = Float(seconds)
# The door's info lines (one per turned-away duplicate) are silenced, as bench/run.rb
# silences them and as the Python door's are by default (logging's WARNING level): a
# guard writes no log line either.
if mode == "door"
  IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"), pool_size: threads, logger: Logger.new(File::NULL))
end

GUARD_SQL = {
  "claim" => "INSERT INTO bench_ceiling_guard (key, token, lease_until) VALUES ($1, gen_random_uuid(), " \
             "now() + interval '300 seconds') ON CONFLICT DO NOTHING RETURNING token",
  "complete" => "UPDATE bench_ceiling_guard SET done = true, completed_at = now() WHERE key = $1 AND token = $2",
  "read" => "SELECT done FROM bench_ceiling_guard WHERE key = $1"
}.freeze

def guard_loop(prefix, thread, stop)
  conn = PG.connect(ENV.fetch("DATABASE_URL"))
  GUARD_SQL.each { |name, sql| conn.prepare(name, sql) }
  done = []
  n = 0
  until stop.true?
    if !done.empty? && n % 4 == 3
      conn.exec_prepared("read", [done[n % done.size]])
    else
      key = "#{prefix}-#{thread}-#{n}"
      won = conn.exec_prepared("claim", [key]).first
      if won
        conn.exec_prepared("complete", [key, won["token"]])
        done << key
      end
    end
    n += 1
  end
  conn.close
  n
end

def door_loop(prefix, thread, stop)
  done = []
  n = 0
  until stop.true?
    key = !done.empty? && n % 4 == 3 ? done[n % done.size] : "#{prefix}-#{thread}-#{n}"
    outcome = IdempotentJob.perform_once("CeilingJob", key) { nil }
    done << key if outcome.ran?
    n += 1
  end
  n
end

# A flag the threads poll (a plain boolean read under the GVL).
class Flag
  def initialize = @set = false
  def set! = @set = true
  def true? = @set
end

stop = Flag.new
started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
workers = Array.new(threads) do |t|
  Thread.new { mode == "door" ? door_loop(prefix, t, stop) : guard_loop(prefix, t, stop) }
end
sleep seconds
stop.set!
ops = workers.sum(&:value)
puts JSON.generate(ops:, seconds: Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
