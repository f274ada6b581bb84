# frozen_string_literal: true

require "json"
require "tmpdir"

module IdempotentJobBench
  # The celery section (issue 22): runs bench/celery_bench.py with the venv's Python (a
  # real prefork `celery worker` draining N operations + 30 % duplicates with no guard,
  # idempotent_job's Celery door, a hand-written psycopg guard and celery-once; see that
  # file) and puts its table and figures into the run's results. bin/python-ext builds
  # and installs the Python package first when it is missing or stale.
  class CeleryRun
    ROOT = File.expand_path("..", __dir__)
    SCRIPT = File.join(__dir__, "celery_bench.py")

    # @param results [Results]
    # @param operations [Integer] operations per run (plus 30 % duplicate sends)
    # @param rounds [Integer] runs of each variant, their order rotating
    # @param dir [String] where the workers' logs go
    # @raise [KeyError] without DATABASE_URL or REDIS_URL
    def initialize(results, operations:, rounds:, dir:)
      @results = results
      @operations = operations
      @rounds = rounds
      @dir = dir
      ENV.fetch("DATABASE_URL")
      ENV.fetch("REDIS_URL")
    end

    # @return [Hash] the figures bench/celery_bench.py wrote (title, headers, rows, notes, records)
    # @raise [RuntimeError] when the Python side fails (its output says why)
    def run
      raise "bin/python-ext failed" unless system(File.join(ROOT, "bin", "python-ext"))

      figures = Dir.mktmpdir("celery-bench") { |tmp| measure(File.join(tmp, "celery.json")) }
      figures.fetch("records").each { |subject, *rest| @results.add("celery", subject, *rest) }
      @results.table("celery", figures.fetch("title"), figures.fetch("headers"), figures.fetch("rows"),
                     notes: figures.fetch("notes"))
      figures
    end

    private

    def measure(json)
      python = File.join(ROOT, ".venv", "bin", "python")
      ok = system(python, SCRIPT, "--operations", @operations.to_s, "--rounds", @rounds.to_s,
                  "--dir", @dir, "--json", json)
      raise "bench/celery_bench.py failed (worker logs in #{@dir})" unless ok

      JSON.parse(File.read(json))
    end
  end
end
