# frozen_string_literal: true

require "json"
require "open3"
require "tmpdir"

module IdempotentJobBench
  # The sections of issue 33's doors: `sqs` (bench/sqs_bench.py: the Python SQS door's
  # consumer loop against moto_server, an SQS emulator, beside a hand-written psycopg
  # guard in the same loop) and `rust` (crates/rust/examples/bench_door.rs: the Rust
  # door's first delivery and duplicate against the core's own statements sent raw with
  # tokio-postgres). Each prints its rounds and adds one table with the median ratio.
  class DoorRuns
    ROOT = File.expand_path("..", __dir__)

    # @param results [Results]
    # @param sqs [Array(Integer, Integer)] operations per round of the SQS run (plus 30 %
    #   duplicate messages; a short queue: moto's receive and delete scan the whole queue) and rounds
    # @param rust [Array(Integer, Integer)] deliveries per variant and round of the Rust run, and rounds
    def initialize(results, sqs:, rust:)
      @results = results
      @sqs_operations, @sqs_rounds = sqs
      @rust_operations, @rust_rounds = rust
    end

    # The Python SQS door against the hand-written guard (target: >= 0.95x its throughput).
    # @raise [RuntimeError] when the Python side fails
    def sqs
      raise "bin/python-ext failed" unless system(File.join(ROOT, "bin", "python-ext"))

      figures = Dir.mktmpdir("sqs-bench") do |tmp|
        json = File.join(tmp, "sqs.json")
        ok = system(File.join(ROOT, ".venv", "bin", "python"), File.join(__dir__, "sqs_bench.py"),
                    "--operations", @sqs_operations.to_s, "--rounds", @sqs_rounds.to_s, "--json", json)
        raise "bench/sqs_bench.py failed" unless ok

        JSON.parse(File.read(json))
      end
      ratio = figures.fetch("ratio")
      @results.add("sqs", "idempotent_job.sqs.Consumer / hand-written psycopg guard", "throughput ratio", ratio, "x")
      @results.table("sqs", "SQS consumer loop against moto_server (an emulator): #{figures.fetch("messages")} " \
                            "messages (30 % duplicates) per variant and round",
                     ["round", "door msg/s", "guard msg/s", "door / guard"], figures.fetch("rows"),
                     notes: ["median ratio #{ratio.round(3)}x (target >= 0.95x); moto's HTTP round trips set the pace"])
    end

    # The Rust door against the raw statements (targets: first <= 1.10x, duplicate <= 1.20x).
    # @raise [RuntimeError] when the example fails to build or run
    def rust
      out, status = Open3.capture2("cargo", "run", "--quiet", "--release", "-p", "idempotent_job_rust",
                                   "--example", "bench_door", "--", @rust_operations.to_s, @rust_rounds.to_s,
                                   chdir: ROOT)
      raise "crates/rust/examples/bench_door.rs failed" unless status.success?

      puts out
      figures = JSON.parse(out.lines.last)
      rows = %w[first duplicate].map do |kind|
        f = figures.fetch(kind)
        @results.add("rust", "Rust door / raw tokio-postgres", "#{kind} ratio", f.fetch("ratio"), "x")
        [kind, f.fetch("door_us").round, f.fetch("floor_us").round, f.fetch("ratio").round(3),
         "<= #{f.fetch("target")}"]
      end
      @results.table("rust", "Rust door against the core's statements sent raw (tokio-postgres, one " \
                             "connection, prepared): #{@rust_operations} deliveries per variant and round, " \
                             "median of #{@rust_rounds}",
                     ["delivery", "door µs", "raw µs", "door / raw", "target"], rows)
    end
  end
end
