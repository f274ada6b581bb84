# frozen_string_literal: true

require "digest/md5"
require_relative "workloads"

module IdempotentJobBench
  # Section 4: claim latency as the record table grows. One schema per size, each
  # with the gem's own migrated table filled with completed records of realistic
  # width (random keys, a payload, a digest), so every size is measured in the same
  # run: sizes are interleaved like the variants of {Latency}. Two deliveries through
  # IdempotentJob.perform_once (no-op body) are timed: a new operation (its claim, an
  # insert into a random place of the index, and its completion) and a duplicate of a
  # random existing record (the read-only look: a random leaf and heap page); each also
  # on a store with synchronous_commit off, where no wait for the disk hides the table's share.
  class TableGrowth
    # What is timed: name => [connection, claim].
    KINDS = { new: %i[durable new], duplicate: %i[durable duplicate],
              new_nosync: %i[nosync new], duplicate_nosync: %i[nosync duplicate] }.freeze
    # Column titles of {KINDS}.
    TITLES = { new: "new", duplicate: "duplicate", new_nosync: "new, no disk wait",
               duplicate_nosync: "duplicate, no disk wait" }.freeze

    # Target: the claim at the largest size at most this many times the smallest.
    TARGET = 1.2
    # Sizes from this one up are loaded without indexes, which are then rebuilt
    # (sorted builds: minutes faster at 10M than inserting into the indexes).
    REBUILD_FROM = 100_000

    # @param db [Database]
    # @param results [Results]
    # @param sizes [Array<Integer>] records per table, ascending
    # @param rounds [Integer] interleaved rounds (10 new + 10 duplicate claims per size each)
    def initialize(db, results, sizes:, rounds:)
      @db = db
      @results = results
      @sizes = sizes
      @rounds = rounds
    end

    # Builds the tables, measures, reports, and drops the tables.
    # @return [Hash{Integer => Hash}] per size: each of {KINDS} ({p50:, p99:} µs), :build (s)
    def run
      builds = @sizes.to_h { |n| [n, build(n)] }
      nosync = "#{@db.url}#{@db.url.include?("?") ? "&" : "?"}options=-c%20synchronous_commit%3Doff"
      stores = @sizes.to_h { |n| [n, { durable: store(n), nosync: store(n, nosync) }] }
      figures = measure(stores)
      figures.each { |n, f| f[:build] = builds[n] }
      report(figures)
      figures
    ensure
      @sizes.each { |n| @db.exec("DROP SCHEMA IF EXISTS #{schema(n)} CASCADE") }
    end

    private

    def schema(size)
      "bench_rows_#{size}"
    end

    def store(size, url = @db.url)
      Gem.store(url, pool_size: 1, schema: schema(size))
    end

    # Creates the schema and its migrated table, fills it; @return [Hash] seconds taken
    def build(size)
      @db.exec("DROP SCHEMA IF EXISTS #{schema(size)} CASCADE")
      @db.exec("CREATE SCHEMA #{schema(size)}")
      store(size).migrate
      table = "#{schema(size)}.idempotent_job_records"
      @db.exec("ALTER TABLE #{table} SET (autovacuum_enabled = false)")
      @db.exec("SET maintenance_work_mem = '256MB'")
      timing = size >= REBUILD_FROM ? load_and_index(table, size) : { insert: Clock.seconds { fill(table, size) } }
      timing[:analyze] = Clock.seconds { @db.exec("ANALYZE #{table}") }
      puts "   #{size} records: #{timing.map { |k, v| "#{k} #{v.round(1)} s" }.join(", ")}"
      timing
    end

    def load_and_index(table, size)
      indexes = @db.exec("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = " \
                         "'idempotent_job_records' AND indexname <> 'idempotent_job_records_pkey'",
                         [schema(size)]).map { |r| [r["indexname"], r["indexdef"]] }
      indexes.each { |name, _| @db.exec("DROP INDEX #{schema(size)}.#{name}") }
      @db.exec("ALTER TABLE #{table} DROP CONSTRAINT idempotent_job_records_pkey")
      insert = Clock.seconds { fill(table, size) }
      index = Clock.seconds do
        @db.exec("ALTER TABLE #{table} ADD CONSTRAINT idempotent_job_records_pkey " \
                 "PRIMARY KEY (job_type, operation_key)")
        indexes.each { |_, definition| @db.exec(definition) }
      end
      { insert:, index: }
    end

    # One INSERT … SELECT generate_series: completed records whose keys are md5(i).
    def fill(table, size)
      @db.exec(<<~SQL, [size])
        INSERT INTO #{table} (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at,
                              args_digest, job_class, queue, args, completed_at, job_classes)
        SELECT 'BenchJob', h, 'completed', gen_random_uuid(), substr(h, 1, 24), 300, now(), h || h,
               'BenchJob', 'default', jsonb_build_array(h), now(), ARRAY['BenchJob']
          FROM generate_series(1, $1::bigint) i, md5(i::text) h
      SQL
    end

    def measure(stores)
      samples = stores.keys.to_h { |n| [n, KINDS.keys.to_h { |k| [k, []] }] }
      rng = Random.new(4)
      # Connections open.
      stores.each { |n, s| s.each_value { |store| Gem.using(store) { 10.times { claim(Op.fresh, n, :new) } } } }
      @rounds.times do
        stores.to_a.shuffle(random: rng).each { |n, s| round(s, n, samples[n], rng) }
      end
      samples.transform_values { |kinds| kinds.transform_values { |s| summary(s) } }
    end

    # Ten claims of each kind, alternately, on the table of `size` records.
    def round(stores, size, samples, rng)
      10.times do
        KINDS.each do |kind, (connection, claim)|
          delivery = claim == :new ? Op.fresh : Op.fresh(Digest::MD5.hexdigest(rng.rand(1..size).to_s))
          Gem.using(stores[connection]) { samples[kind] << timed { claim(delivery, size, claim) } }
        end
      end
    end

    def summary(samples)
      { p50: Stats.median(samples), p99: Stats.percentile(samples, 0.99) }
    end

    def timed
      started = Clock.now
      yield
      (Clock.now - started) * 1e6
    end

    # One delivery through IdempotentJob.perform_once on the facade's store ({Gem.using}).
    def claim(delivery, size, kind)
      decision = Gem.deliver(delivery)
      expected = kind == :new ? :ran : :completed
      raise "#{size} records: a #{kind} claim decided #{decision.inspect}" unless decision == expected
    end

    def report(figures)
      base = figures[@sizes.first]
      rows = figures.map do |n, f|
        record(n, f, base)
        [n.to_s.reverse.scan(/\d{1,3}/).join(",").reverse, f[:build].map { |k, v| "#{k} #{v.round(1)} s" }.join(", "),
         *KINDS.keys.flat_map { |k| cells(f[k], base[k]) }, verdict(n, f, base)]
      end
      headers = ["records", "built in", *KINDS.keys.flat_map { |k| ["#{TITLES[k]} µs p50 / p99", "×"] }, "target"]
      @results.table("growth", "4. Table growth: delivery latency (gem, perform_once) by records in the table",
                     headers, rows, notes:)
    end

    def cells(figure, base)
      ["#{Format.num(figure[:p50])} / #{Format.num(figure[:p99])}", Format.ratio(Stats.ratio(figure[:p50], base[:p50]))]
    end

    def verdict(size, figure, base)
      return "" unless size == @sizes.last && size > @sizes.first

      Format.verdict(Stats.ratio(figure[:new][:p50], base[:new][:p50]) <= TARGET, "≤ #{TARGET}× smallest")
    end

    def record(size, figure, base)
      KINDS.each_key do |kind|
        %i[p50 p99].each { |m| @results.add("growth", "#{kind}_claim", "#{m}_#{size}_records", figure[kind][m], "us") }
        @results.add("growth", "#{kind}_claim", "ratio_p50_#{size}_to_#{@sizes.first}",
                     Stats.ratio(figure[kind][:p50], base[kind][:p50]), "x")
      end
      figure[:build].each { |step, s| @results.add("growth", "build", "#{step}_#{size}_records", s, "s") }
    end

    def notes
      ["#{@rounds * 10} claims of each kind per size, sizes interleaved in a random order per round; × = ratio of " \
       "p50s to the smallest table. new = a first claim of a random key; duplicate = a claim of a random existing " \
       "(completed) record; no disk wait = the same on a connection with synchronous_commit off (the table's " \
       "own share, which the WAL flush otherwise hides).",
       "tables of #{REBUILD_FROM} records and more are filled with one INSERT … SELECT generate_series without " \
       "indexes, then indexed (freshly built, packed indexes); ANALYZEd; autovacuum off on these tables " \
       "while measuring (it would compete for the CPU); shared_buffers as configured (see the header)."]
    end
  end
end
