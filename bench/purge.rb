# frozen_string_literal: true

require_relative "workloads"

module IdempotentJobBench
  # Section 6: retention (issue 25). The purge alone on tables of due records of each
  # size (its time should grow with the records, not with their square), then the
  # purge of one table while 10 threads claim new operations in it, against the same
  # claimers without a purge: the claims' p99 with and without it. Each table is the
  # gem's migrated table in a schema of its own, filled with completed records that
  # finished two days ago, one millisecond apart, and ANALYZEd.
  class Purge
    # Target: the largest table's purge time at most this many times the smallest's
    # per record (8× the records: about 8× the time).
    TARGET_LINEAR = 1.25
    # Target: claim p99 during the purge at most this many times without it.
    TARGET_P99 = 1.2
    # Claiming threads during the loaded run.
    CLAIMERS = 10
    # Records per batch alone (the gem's default) and under load (a gentler batch).
    BATCH = 1000
    LOADED_BATCH = 200

    # @param db [Database]
    # @param results [Results]
    # @param sizes [Array<Integer>] records per table for the purge alone, ascending
    # @param loaded [Integer] records purged while the claimers run
    def initialize(db, results, sizes:, loaded:)
      @db = db
      @results = results
      @sizes = sizes
      @loaded = loaded
    end

    # Builds the tables, measures, reports and drops them.
    # @return [Hash] :alone (size => seconds), :loaded (figures)
    def run
      alone = @sizes.to_h { |n| [n, alone(n)] }
      loaded = loaded_run
      report(alone, loaded)
      { alone:, loaded: }
    ensure
      (@sizes + [@loaded]).uniq.each { |n| @db.exec("DROP SCHEMA IF EXISTS #{schema(n)} CASCADE") }
    end

    private

    def schema(size)
      "bench_purge_#{size}"
    end

    def store(size, pool_size: 2)
      Gem.store(@db.url, pool_size:, schema: schema(size))
    end

    # A fresh migrated table of `size` due completed records.
    def build(size)
      @db.exec("DROP SCHEMA IF EXISTS #{schema(size)} CASCADE")
      @db.exec("CREATE SCHEMA #{schema(size)}")
      store(size).migrate
      table = "#{schema(size)}.idempotent_job_records"
      @db.exec(<<~SQL, [size])
        INSERT INTO #{table} (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at,
                              args_digest, job_class, queue, args, completed_at, job_classes)
        SELECT 'BenchJob', h, 'completed', gen_random_uuid(), substr(h, 1, 24), 300, now(), h || h, 'BenchJob',
               'default', jsonb_build_array(h), now() - interval '2 days' + i * interval '1 ms', ARRAY['BenchJob']
          FROM generate_series(1, $1::bigint) i, md5(i::text) h
      SQL
      @db.exec("VACUUM ANALYZE #{table}")
    end

    # The gem's purge loop (IdempotentJob.purge) on `store`. @return [Array] [deleted, seconds]
    def purge(store, batch)
      total = 0
      cursor = nil
      seconds = Clock.seconds do
        loop do
          deleted, picked, cursor = store.purge_batch(3600.0, batch, cursor)
          total += deleted
          break if picked < batch
        end
      end
      [total, seconds]
    end

    def alone(size)
      build(size)
      deleted, seconds = purge(store(size), BATCH)
      raise "purge of #{size} records deleted #{deleted}" unless deleted == size

      puts "   #{size} records purged alone in #{seconds.round(2)} s"
      seconds
    end

    # Claimers alone, then claimers while the purge runs; @return [Hash]
    def loaded_run
      build(@loaded)
      claims = store(@loaded, pool_size: CLAIMERS)
      CLAIMERS.times { claim(claims) } # connections open
      deleted = seconds = nil
      during = claiming(claims) do
        deleted, seconds = purge(store(@loaded), LOADED_BATCH)
      end
      raise "purge under load deleted #{deleted} of #{@loaded}" unless deleted == @loaded

      without = claiming(claims) { sleep([seconds, 2.0].max) }
      puts "   #{@loaded} records purged under #{CLAIMERS} claimers in #{seconds.round(2)} s"
      { seconds:, during: summary(during), without: summary(without) }
    end

    # Runs CLAIMERS threads claiming new operations until the block returns.
    # @return [Array<Float>] claim latencies (µs)
    def claiming(store)
      stop = false
      threads = Array.new(CLAIMERS) do
        Thread.new do
          samples = []
          until stop
            started = Clock.now
            claim(store)
            samples << ((Clock.now - started) * 1e6)
          end
          samples
        end
      end
      yield
      stop = true
      threads.flat_map(&:value)
    end

    def claim(store)
      delivery = Op.fresh
      decision = store.claim(job_type: Variant::JOB_TYPE, operation_key: delivery.key, jid: delivery.jid,
                             lease: Variant::LEASE, args_digest: delivery.digest, job_class: Variant::JOB_TYPE,
                             queue: "default", args_json: delivery.args_json, refuse_mismatch: false)[:decision]
      raise "a new claim decided #{decision.inspect}" unless decision == :claimed
    end

    def summary(samples)
      { claims: samples.size, p50: Stats.median(samples), p99: Stats.percentile(samples, 0.99) }
    end

    def report(alone, loaded)
      small, large = alone.keys.minmax
      per_record = Stats.ratio(alone[large] / large, alone[small] / small)
      p99 = Stats.ratio(loaded[:during][:p99], loaded[:without][:p99])
      record(alone, loaded, per_record, p99)
      rows = alone.map do |n, s|
        linear = n == large && large > small
        [n.to_s, Format.num(s, 2), Format.ratio(Stats.ratio(s, alone[small])), "#{Format.ratio(n.fdiv(small))} records",
         linear ? Format.verdict(per_record <= TARGET_LINEAR, "≈ linear (≤ #{TARGET_LINEAR}× per record)") : ""]
      end
      rows << loaded_row(loaded, p99)
      @results.table("purge", "6. Purge: seconds by records due, alone and under claims",
                     ["records", "seconds", "× smallest", "size ×", "target"], rows, notes:)
    end

    def loaded_row(loaded, p99)
      ["#{@loaded} under #{CLAIMERS} claimers (batch #{LOADED_BATCH})", Format.num(loaded[:seconds], 2),
       "claim p50 / p99 µs: #{claims(loaded[:during])} with purge, #{claims(loaded[:without])} without",
       "p99 #{Format.ratio(p99)}", Format.verdict(p99 <= TARGET_P99, "p99 ≤ #{TARGET_P99}× without")]
    end

    def record(alone, loaded, per_record, p99)
      alone.each { |n, s| @results.add("purge", "alone", "seconds_#{n}_records", s, "s") }
      @results.add("purge", "alone", "time_per_record_ratio_#{alone.keys.max}_to_#{alone.keys.min}", per_record, "x")
      %i[during without].each do |run|
        %i[p50 p99].each { |m| @results.add("purge", "claims_#{run}_purge", m.to_s, loaded[run][m], "us") }
      end
      @results.add("purge", "loaded", "seconds_#{@loaded}_records", loaded[:seconds], "s")
      @results.add("purge", "loaded", "claim_p99_ratio", p99, "x")
    end

    def claims(figure)
      "#{Format.num(figure[:p50])} / #{Format.num(figure[:p99])} (#{figure[:claims]})"
    end

    def notes
      ["alone: IdempotentJob.purge's loop (batch #{BATCH}) over completed records due since 2 days, one ms apart, " \
       "random keys, VACUUM ANALYZEd first. under claims: #{CLAIMERS} threads claim new operations in the same " \
       "table while the purge runs (batch #{LOADED_BATCH}), then for as long again (at least 2 s) without it."]
    end
  end
end
