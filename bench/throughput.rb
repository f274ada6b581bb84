# frozen_string_literal: true

require_relative "workloads"

module IdempotentJobBench
  # Section 3: first deliveries (claim + completion) per second from N Ruby threads,
  # the gem with a pool of N connections vs the floor's statements through the pg gem
  # with a pool of N connections. If the gem held Ruby's GVL while waiting on
  # PostgreSQL, its throughput would not grow with threads.
  class Throughput
    # The pg-gem side: N connections, each a {Floor}, checked out per delivery.
    class RawPool
      # @param db [Database]
      # @param size [Integer] connections
      def initialize(db, size)
        @all = Array.new(size) { Floor.new(db.connect) }
        @free = SizedQueue.new(size)
        @all.each { |f| @free << f }
      end

      # One first delivery on a pooled connection.
      # @param delivery [Op]
      # @return [void]
      def first(delivery)
        floor = @free.pop
        begin
          floor.first(delivery)
        ensure
          @free << floor
        end
      end

      # @return [void]
      def close
        @all.each(&:close)
      end
    end

    # Target: the gem's throughput at 10 threads at least this fraction of raw pg's.
    TARGET = 1.0

    # @param db [Database]
    # @param results [Results]
    # @param threads [Array<Integer>] thread counts
    # @param seconds [Float] length of each timed run
    # @param repeats [Integer] runs per thread count and side (alternating which goes first)
    def initialize(db, results, threads:, seconds:, repeats:)
      @db = db
      @results = results
      @threads = threads
      @seconds = seconds
      @repeats = repeats
    end

    # Runs every thread count and reports.
    # @return [Hash{Integer => Hash}] per thread count: :gem, :raw (median deliveries/s), :ratio
    def run
      figures = @threads.to_h { |n| [n, measure(n)] }
      report(figures)
      figures
    end

    private

    def measure(threads)
      raw = RawPool.new(@db, threads)
      Gem.configure(@db.url, pool_size: threads)
      gem = GemStore.new
      sides = { gem:, raw: }
      sides.each_value { |side| run_for(side, threads, 0.2) } # connections open, caches warm
      samples = { gem: [], raw: [] }
      @repeats.times do |r|
        (r.even? ? %i[gem raw] : %i[raw gem]).each { |s| samples[s] << run_for(sides[s], threads, @seconds) }
      end
      raw.close
      ratios = samples[:gem].zip(samples[:raw]).map { |g, w| g / w }
      { gem: Stats.median(samples[:gem]), raw: Stats.median(samples[:raw]), ratio: Stats.median(ratios) }
    end

    # @return [Float] first deliveries per second over `seconds` from `threads` threads
    def run_for(side, threads, seconds)
      gate = Queue.new
      done = Array.new(threads, 0)
      workers = Array.new(threads) do |i|
        Thread.new do
          deadline = gate.pop
          while Clock.now < deadline
            side.first(Op.fresh)
            done[i] += 1
          end
          Clock.now
        end
      end
      started = Clock.now
      threads.times { gate << (started + seconds) }
      finished = workers.map(&:value).max
      done.sum / (finished - started)
    end

    def report(figures)
      base = figures[@threads.first]
      rows = figures.map do |n, f|
        record(n, f, base)
        [n.to_s, Format.num(f[:gem]), Format.num(f[:raw]), Format.ratio(f[:ratio]),
         Format.ratio(Stats.ratio(f[:gem], base[:gem])), Format.ratio(Stats.ratio(f[:raw], base[:raw])),
         n == 10 ? Format.verdict(f[:ratio] >= TARGET, "≥ #{TARGET}× raw") : ""]
      end
      @results.table("throughput", "3. Throughput: first deliveries (claim + completion) per second, N threads, " \
                                   "pool of N",
                     ["threads", "gem /s", "raw pg /s", "gem / raw", "gem vs 1 thread", "raw vs 1 thread", "target"],
                     rows, notes:)
    end

    def record(threads, figure, base)
      @results.add("throughput", "gem", "deliveries_per_s_#{threads}_threads", figure[:gem], "1/s")
      @results.add("throughput", "raw", "deliveries_per_s_#{threads}_threads", figure[:raw], "1/s")
      @results.add("throughput", "gem", "ratio_to_raw_#{threads}_threads", figure[:ratio], "x")
      @results.add("throughput", "gem", "scaling_#{threads}_threads", Stats.ratio(figure[:gem], base[:gem]), "x")
    end

    def notes
      ["each: median of #{@repeats} runs of #{@seconds} s, gem and raw alternating (gem / raw = median of the " \
       "paired ratios); raw = the floor's statements (pg gem, named prepared, as the gem sends them), one " \
       "pooled connection per delivery.",
       "new operations each time; durable commits; the record table grows as it goes."]
    end
  end
end
