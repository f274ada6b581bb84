# frozen_string_literal: true

require_relative "round_trip_proxy"
require_relative "server_times"
require_relative "workloads"

module IdempotentJobBench
  # Sections 1 and 2: the cost of one delivery, single-threaded, each variant on one
  # connection of its own.
  #
  # * counting pass — every variant runs a few deliveries through a {RoundTripProxy}:
  #   round trips, statements (pg_stat_statements), write commits (transaction ids
  #   assigned: one per transaction that wrote, a durable commit unless
  #   synchronous_commit is off for it) and WAL bytes per delivery;
  # * timed pass — variants interleaved in batches, in a random order each round,
  #   every delivery timed; p50, p99 and mean per variant, ratios of p50s.
  class Latency
    # Deliveries per variant in the counting pass.
    COUNTED = 50
    # Completed operations per variant that the duplicate section re-delivers.
    SEEDS = 50
    # Random seed of the interleaving order (reproducible runs).
    SHUFFLE_SEED = 8

    # @param db [Database]
    # @param results [Results]
    # @param rounds [Integer] interleaved rounds
    # @param batch [Integer] deliveries per variant per round
    def initialize(db, results, rounds:, batch:)
      @db = db
      @results = results
      @rounds = rounds
      @batch = batch
    end

    # Section 1: first delivery (claim + completion, durable commits) per job.
    # @return [Hash{Symbol => Hash}] per variant name: :p50, :p99, :mean (µs), counts
    def first
      measure(:first)
    end

    # Section 2: duplicate delivery (the record is completed) per job.
    # @return [Hash{Symbol => Hash}] as {#first}
    def duplicate
      measure(:duplicate)
    end

    private

    def measure(kind)
      counts = counting_pass(kind)
      Gem.configure(@db.url, pool_size: 1)
      variants = build(@db.url, kind)
      seeds = seed(variants, kind)
      server = ServerTimes.new(@db)
      timed = false
      figures = timed_pass(variants, kind, seeds) { timed = server.reset }
      variants.each(&:close)
      figures.each { |name, f| f.merge!(counts.fetch(name, {})) }
      report(kind, variants, figures)
      if timed
        server.report(@results, kind.to_s,
                      "#{kind == :first ? 1 : 2}b. Server time per statement, #{kind} delivery")
      end
      figures
    end

    def build(url, kind)
      list = [Floor.new(@db.connect(url)), GemStore.new, GemMiddleware.new, HandWritten.new(@db.connect(url))]
      list << RoundTrip.new(@db.connect(url)) if kind == :duplicate
      list << GemMiddleware.new(BenchJobNoHeartbeat, name: :middleware_no_heartbeat,
                                                     label: "diagnostic: gem middleware, heartbeat off")
      list + unnamed(url) + proposals(url, kind) + diagnostics(url)
    end

    # The same with `prepared_statements: false` (PgBouncer in transaction mode): the
    # statements are parsed and planned at every call. Both run as the role
    # {ServerTimes::UNNAMED_ROLE}, so pg_stat_statements counts their plans apart from
    # the named statements' (the same statement text, hence the same query id).
    def unnamed(url)
      url = ServerTimes.new(@db).unnamed_url(url)
      store = Gem.store(url, pool_size: 1, prepared_statements: false)
      label = "gem, prepared_statements: false (× unnamed floor)"
      [Floor.new(@db.connect(url), name: :floor_unnamed, named: false, label: "floor, unnamed statements"),
       GemStore.new(store, name: :gem_unnamed, baseline: :floor_unnamed, label:)]
    end

    # Proposal A (a first delivery's completion committed asynchronously) on the floor,
    # and the gem with `asynchronous_completion: true` (× that floor). A duplicate
    # writes nothing any more: no proposal for it.
    def proposals(url, kind)
      return [] unless kind == :first

      store = Gem.store(url, pool_size: 1, asynchronous_completion: true)
      [Floor.new(@db.connect(url), name: :async, async: :complete,
                                   label: "proposal A: floor, completion committed asynchronously"),
       GemStore.new(store, name: :gem_async, baseline: :async,
                           label: "gem, asynchronous_completion: true (× proposal A floor)")]
    end

    # Both without waiting for the disk, to show the gem's own overhead (× its own floor).
    def diagnostics(url)
      nosync = "#{url}#{url.include?("?") ? "&" : "?"}options=-c%20synchronous_commit%3Doff"
      [Floor.new(@db.connect(nosync), name: :floor_nosync, label: "diagnostic: floor, synchronous_commit off"),
       GemStore.new(Gem.store(nosync, pool_size: 1), name: :gem_nosync, baseline: :floor_nosync,
                                                     label: "diagnostic: gem, synchronous_commit off (× its floor)")]
    end

    # Completed operations for each variant to re-deliver (in its own job type or table).
    def seed(variants, kind)
      return {} unless kind == :duplicate

      floor = variants.find { |v| v.name == :floor }
      variants.to_h do |v|
        seeder = v.respond_to?(:first) ? v : floor
        [v.name, Array.new(SEEDS) { Op.fresh.tap { |op| seeder.first(op) } }]
      end
    end

    def counting_pass(kind)
      proxy = RoundTripProxy.new(URI.parse(@db.url).host, URI.parse(@db.url).port).start
      url = @db.url_via("127.0.0.1", proxy.port)
      Gem.configure(url, pool_size: 1)
      variants = build(url, kind)
      seeds = seed(variants, kind)
      counts = variants.to_h { |v| [v.name, count(v, kind, proxy, seeds[v.name])] }
      variants.each(&:close)
      counts
    ensure
      Gem.configure(@db.url, pool_size: 1)
      proxy&.stop
    end

    def count(variant, kind, proxy, seeds)
      deliveries = seeds ? seeds.cycle.take(COUNTED + 3) : Array.new(COUNTED + 3) { Op.fresh }
      deliveries.first(3).each { |d| variant.public_send(kind, d) } # connections open, statements prepared
      before = @db.counters.merge(round_trips: proxy.round_trips)
      allocated = GC.stat(:total_allocated_objects)
      deliveries.drop(3).each { |d| variant.public_send(kind, d) }
      allocated = GC.stat(:total_allocated_objects) - allocated
      after = @db.counters.merge(round_trips: proxy.round_trips, allocations: allocated)
      before[:allocations] = 0
      before.to_h { |key, value| [key, value && ((after[key] - value).to_f / COUNTED)] }
    end

    # Warms every variant, yields (the server's statistics start there), then times.
    def timed_pass(variants, kind, seeds)
      samples = variants.to_h { |v| [v.name, []] }
      warm(variants, kind, seeds)
      yield
      rng = Random.new(SHUFFLE_SEED)
      @rounds.times do |round|
        variants.shuffle(random: rng).each do |v|
          batch(seeds[v.name], round).each do |delivery|
            started = Clock.now
            v.public_send(kind, delivery)
            samples[v.name] << ((Clock.now - started) * 1e6)
          end
        end
      end
      samples.transform_values { |s| { p50: Stats.median(s), p99: Stats.percentile(s, 0.99), mean: Stats.mean(s) } }
    end

    # @return [Array<Op>] the next batch: new operations, or the next of the seeds
    def batch(seeds, round)
      return Array.new(@batch) { Op.fresh } unless seeds

      Array.new(@batch) { |i| seeds[((round * @batch) + i) % SEEDS] }
    end

    def warm(variants, kind, seeds)
      variants.each { |v| 10.times { |i| v.public_send(kind, seeds[v.name] ? seeds[v.name][i] : Op.fresh) } }
    end

    def report(kind, variants, figures)
      section = kind.to_s
      trip = figures.dig(:round_trip, :p50)
      rows = variants.map do |v|
        f = figures[v.name]
        record(section, v, f, figures[v.baseline], trip)
        row(v, f, figures[v.baseline][:p50], trip, kind)
      end
      title, notes = caption(kind)
      @results.table(section, title, headers(kind), rows, notes:)
    end

    def record(section, variant, figure, floor, trip)
      %i[p50 p99 mean].each { |m| @results.add(section, variant.name, m, figure[m], "us", variant.label) }
      @results.add(section, variant.name, "ratio_p50_to_#{variant.baseline}", Stats.ratio(figure[:p50], floor[:p50]),
                   "x")
      @results.add(section, variant.name, "ratio_mean_to_#{variant.baseline}", Stats.ratio(figure[:mean], floor[:mean]),
                   "x")
      @results.add(section, variant.name, "ratio_p50_to_round_trip", Stats.ratio(figure[:p50], trip), "x") if trip
      %i[round_trips statements writes wal_bytes allocations].each do |m|
        @results.add(section, variant.name, "#{m}_per_op", figure[m], m == :wal_bytes ? "bytes" : "count")
      end
    end

    def headers(kind)
      ["variant", "p50 µs", "p99 µs", "mean µs", "× floor", (kind == :duplicate ? "× round trip" : nil),
       "round trips", "statements", "write commits", "WAL B", "Ruby objects", "target"].compact
    end

    def row(variant, figure, floor, trip, kind)
      cells = [variant.label, Format.num(figure[:p50]), Format.num(figure[:p99]), Format.num(figure[:mean]),
               Format.ratio(Stats.ratio(figure[:p50], floor))]
      cells << Format.ratio(Stats.ratio(figure[:p50], trip)) if kind == :duplicate
      cells + [Format.num(figure[:round_trips], 2), Format.num(figure[:statements], 2),
               Format.num(figure[:writes], 2), Format.num(figure[:wal_bytes]), Format.num(figure[:allocations], 1),
               target(variant, figure, floor, trip)]
    end

    # Issue 14's targets: first delivery, perform_once (the gem variant) ≤ 1.10× the floor, the middleware
    # ≤ 1.20×, the gem without a disk wait ≤ 1.20× its floor; duplicate, the
    # middleware ≤ 1.30× one raw round trip (perform_once: one statement, ≤ 1.10×).
    TARGETS = { first: { gem: 1.10, middleware: 1.20, gem_nosync: 1.20 },
                duplicate: { gem: 1.10, middleware: 1.30 } }.freeze

    def target(variant, figure, floor, trip)
      limit = TARGETS.fetch(trip ? :duplicate : :first)[variant.name]
      return "" unless limit
      return Format.verdict(Stats.ratio(figure[:p50], floor)&.<=(limit), "≤ #{Format.ratio(limit)} floor") unless trip

      statements = figure[:statements] && figure[:statements] < 1.1
      [Format.verdict(statements, "1 statement + batched bookkeeping"),
       Format.verdict(Stats.ratio(figure[:p50], trip)&.<=(limit), "≤ #{Format.ratio(limit)} round trip")].join("; ")
    end

    def caption(kind)
      common = ["p50/p99/mean over #{@rounds * @batch} deliveries per variant, interleaved in batches of " \
                "#{@batch} in a random order per round; × = ratio of p50s in this run.",
                "round trips counted by a TCP proxy; statements by pg_stat_statements; write commits = " \
                "transactions that wrote (transaction ids assigned), each a durable commit unless synchronous_commit " \
                "is off for it (proposal A, diagnostics); Ruby objects = objects allocated in this Ruby process " \
                "(GC.stat total_allocated_objects, the bench's own Op and the variant's call included); all per " \
                "delivery, #{COUNTED} deliveries.",
                "proposals are changes prototyped here with raw SQL on the floor (proposal A for completions " \
                "is the gem's `asynchronous_completion: true`).",
                "diagnostics: both connections with synchronous_commit off (no wait for the disk), so the gem's own " \
                "overhead shows; the diagnostic gem's × is to the diagnostic floor."]
      if kind == :first
        ["1. First delivery: claim + completion of a new operation (synchronous_commit on)", common]
      else
        ["2. Duplicate delivery: the operation is already completed (the body must not run)", common]
      end
    end
  end
end
