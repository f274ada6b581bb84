# frozen_string_literal: true

require "securerandom"
require_relative "round_trip_proxy"

module IdempotentJobBench
  # Section "replay" (stored results, issue 23): a repeat of a completed operation
  # whose completion stored a result, beside the plain duplicate (no result stored),
  # through `IdempotentJob.perform_once` on one pooled connection. Counting pass through
  # a {RoundTripProxy} (round trips per repeat, the batched repeat bookkeeping's share
  # included, the same for every case), then a timed pass with the cases interleaved.
  # Also the first delivery with and without `store_result` (the result rides on the
  # completion statement: the same round trips).
  class Replay
    # Results stored by the replay cases (nil: the plain duplicate, nothing stored).
    CASES = {
      duplicate: nil,
      replay_small: { "charge_id" => "ch_1", "cents" => 1500 },
      replay_8k: { "charge_id" => "ch_1", "receipt" => "x" * 8_000 }
    }.freeze
    # Labels of the printed table.
    LABELS = { duplicate: "plain duplicate (no result stored)", replay_small: "replay, 40-byte result",
               replay_8k: "replay, 8 KB result", first: "first delivery, no store_result",
               first_stored: "first delivery, store_result (40 bytes)" }.freeze
    # Calls per case in the counting pass.
    COUNTED = 20

    # @param db [Database]
    # @param results [Results]
    # @param rounds [Integer] interleaved rounds of the timed pass
    # @param batch [Integer] calls per case per round
    def initialize(db, results, rounds:, batch:)
      @db = db
      @results = results
      @rounds = rounds
      @batch = batch
      @run = SecureRandom.hex(4)
    end

    # Runs the section and adds its table.
    # @return [Hash{Symbol => Hash}] per case: :round_trips, :p50, :mean (µs)
    def run
      keys = CASES.to_h { |name, value| [name, seed(name, value, COUNTED + (@rounds * @batch) + 2)] }
      figures = count(keys)
      timed(keys).each { |name, f| (figures[name] ||= {}).merge!(f) }
      report(figures)
      figures
    ensure
      Gem.configure(@db.url, pool_size: 1)
    end

    private

    def type(name) = "BenchReplay_#{name}_#{@run}"

    # Completed operations of `name`'s job type, with its result stored (or none).
    def seed(name, value, count)
      Gem.configure(@db.url, pool_size: 1)
      Array.new(count) do |i|
        key = "#{name}-#{i}"
        IdempotentJob.perform_once(type(name), key, store_result: !value.nil?) { value }
        key
      end
    end

    def repeat(name, key)
      outcome = IdempotentJob.perform_once(type(name), key) { raise "a repeat must not run" }
      raise "#{name}: expected a completed repeat, got #{outcome.decision}" unless outcome.decision == :completed
      raise "#{name}: expected a replay" if CASES[name] && !outcome.replayed?
    end

    def first(name, stored)
      IdempotentJob.perform_once(type(name), SecureRandom.uuid, store_result: stored) { CASES[:replay_small] }
    end

    def count(keys)
      uri = URI.parse(@db.url)
      proxy = RoundTripProxy.new(uri.host, uri.port).start
      Gem.configure(@db.url_via("127.0.0.1", proxy.port), pool_size: 1)
      warm(keys)
      figures = CASES.keys.to_h do |name|
        [name, { round_trips: per_call(proxy) { keys[name].first(COUNTED).each { |key| repeat(name, key) } } }]
      end
      { first: false, first_stored: true }.each do |name, stored|
        figures[name] = { round_trips: per_call(proxy) { COUNTED.times { first(name, stored) } } }
      end
      figures
    ensure
      Gem.configure(@db.url, pool_size: 1)
      proxy&.stop
    end

    # The connection and its prepared statements, before anything is counted.
    def warm(keys)
      CASES.each_key { |name| repeat(name, keys[name].last) }
      first(:first, false)
      first(:first_stored, true)
      IdempotentJob.settle_repeats
    end

    # Round trips per call of the block's COUNTED calls, the repeat bookkeeping included.
    def per_call(proxy)
      before = proxy.round_trips
      yield
      IdempotentJob.settle_repeats
      (proxy.round_trips - before).to_f / COUNTED
    end

    def timed(keys)
      samples = Hash.new { |h, k| h[k] = [] }
      left = keys.transform_values { |list| list.drop(COUNTED + 1) }
      order = CASES.keys + %i[first first_stored]
      @rounds.times do |round|
        order.shuffle(random: Random.new(round)).each do |name|
          @batch.times do
            key = left[name]&.shift
            samples[name] << (Clock.seconds do
              case name
              when :first then first(:first, false)
              when :first_stored then first(:first_stored, true)
              else repeat(name, key)
              end
            end * 1e6)
          end
        end
      end
      samples.transform_values { |s| { p50: Stats.median(s), mean: Stats.mean(s) } }
    end

    def report(figures)
      base = figures.dig(:duplicate, :p50)
      first = figures.dig(:first, :p50)
      rows = figures.map do |name, f|
        against = %i[first first_stored].include?(name) ? first : base
        %w[round_trips p50 mean].each do |m|
          @results.add("replay", name, m, f[m.to_sym], m == "round_trips" ? "" : "us")
        end
        [LABELS.fetch(name), Format.num(f[:round_trips], 2), Format.num(f[:p50]), Format.num(f[:mean]),
         Format.ratio(Stats.ratio(f[:p50], against))]
      end
      @results.table("replay", "9. Stored results: a replay beside the plain duplicate (perform_once, 1 thread)",
                     ["case", "round trips", "p50 µs", "mean µs", "× p50 of its plain twin"], rows,
                     notes: ["round trips include each call's share of the batched repeat bookkeeping " \
                             "(written in the background, the same for every repeat)",
                             "the replay's value comes back in the duplicate's own claim statement; a stored " \
                             "result rides on the completion statement"])
    end
  end
end
