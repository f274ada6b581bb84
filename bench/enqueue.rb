# frozen_string_literal: true

require "sidekiq"
require "sidekiq/api"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "idempotent_job/sidekiq"

module IdempotentJobBench
  # A job pushed the default way: every push is queued.
  class BenchPushJob
    include Sidekiq::Job
    sidekiq_options idempotency_key: :order_id, queue: "bench_enqueue"

    def perform(order_id); end
  end

  # The same job with reject at enqueue.
  class BenchSkipJob
    include Sidekiq::Job
    sidekiq_options idempotency_key: :order_id, idempotency_on_enqueue: :skip_completed, queue: "bench_enqueue"

    def perform(order_id); end
  end

  # Section 7: the producer's cost of `idempotency_on_enqueue: :skip_completed` — the
  # real Sidekiq client pushing to the real Redis, single-threaded, per push:
  # * push — the option off (no database statement);
  # * check, pushed — the option on, operation not completed: one read-only statement
  #   (COMPLETED_SQL), then the push;
  # * check, dropped — the option on, operation completed: the statement, no push.
  # Interleaved in batches, each push timed; p50, p99 and mean in µs, and the
  # statements per push counted by pg_stat_statements when it is loaded.
  class EnqueueCost
    # @param db [Database]
    # @param results [Results]
    # @param rounds [Integer] interleaved rounds
    # @param batch [Integer] pushes per variant per round
    def initialize(db, results, rounds:, batch:)
      @db = db
      @results = results
      @rounds = rounds
      @batch = batch
    end

    # @return [Hash{Symbol => Hash}] per variant: :p50, :p99, :mean (µs), :statements
    def run
      @queue = Sidekiq::Queue.new("bench_enqueue")
      completed = seed_completed((@rounds * @batch) + 5)
      counts = count_statements(completed.pop(5))
      times = { push: [], pushed: [], dropped: [] }
      @rounds.times do |round|
        %i[push pushed dropped].shuffle(random: Random.new(round)).each do |variant|
          @batch.times { |i| times[variant] << time_push(variant, key_for(variant, round, i, completed)) }
        end
      end
      @queue.clear
      report(times, counts)
    end

    private

    def key_for(variant, round, index, completed)
      variant == :dropped ? completed[(round * @batch) + index] : "#{variant}-#{Process.pid}-#{round}-#{index}"
    end

    # @return [Float] the push's time in µs
    def time_push(variant, key)
      job = variant == :push ? BenchPushJob : BenchSkipJob
      started = Clock.now
      jid = job.perform_async(key)
      elapsed = (Clock.now - started) * 1e6
      raise "bench: #{variant} push of #{key} #{jid ? "queued" : "dropped"}" if jid.nil? != (variant == :dropped)

      elapsed
    end

    # Operations of BenchSkipJob completed through the plain API (the same job type).
    def seed_completed(count)
      Array.new(count) do |i|
        key = "done-#{Process.pid}-#{i}"
        IdempotentJob.perform_once(BenchSkipJob.name, key) { nil }
        key
      end
    end

    # Statements the database ran per push of each variant (nil without
    # pg_stat_statements), over 5 pushes each (`completed`: 5 completed operations).
    def count_statements(completed)
      %i[push pushed dropped].to_h do |variant|
        before = @db.counters[:statements]
        completed.each_with_index { |key, i| time_push(variant, variant == :dropped ? key : "count-#{variant}-#{i}") }
        after = @db.counters[:statements]
        [variant, before && after ? (after - before) / completed.size.to_f : nil]
      end
    end

    def report(times, counts)
      labels = { push: "push (option off)", pushed: "check, pushed (not completed)",
                 dropped: "check, dropped (completed)" }
      figures = times.to_h do |variant, values|
        [variant, { p50: Stats.median(values), p99: Stats.percentile(values, 0.99), mean: Stats.mean(values),
                    statements: counts[variant] }]
      end
      rows = figures.map { |variant, f| row(variant, labels.fetch(variant), f) }
      extra = figures[:pushed][:p50] - figures[:push][:p50]
      @results.add("enqueue", "check", "extra_p50_per_push", extra, "us")
      @results.table("enqueue", "7. Reject at enqueue: cost per Sidekiq push (µs, #{times[:push].size} pushes each)",
                     %w[push p50 p99 mean statements], rows,
                     notes: ["the check adds #{Format.num(extra)} µs (p50) to a push that goes ahead; " \
                             "statements counted by pg_stat_statements (all the database ran, per push)"])
      figures
    end

    def row(variant, label, figures)
      @results.add("enqueue", variant, "p50", figures[:p50], "us")
      @results.add("enqueue", variant, "p99", figures[:p99], "us")
      @results.add("enqueue", variant, "statements_per_push", figures[:statements], "1") if figures[:statements]
      [label, Format.num(figures[:p50]), Format.num(figures[:p99]), Format.num(figures[:mean]),
       figures[:statements] ? Format.num(figures[:statements], 1) : "n/a"]
    end
  end
end
