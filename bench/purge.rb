# frozen_string_literal: true

require_relative "workloads"

module IdempotentJobBench
  # Section 7: retention (issue 25). The purge alone on tables of due records of each
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
                              args_digest, job_class, queue, args, first_claimed_at, completed_at, job_classes)
        SELECT 'BenchJob', h, 'completed', gen_random_uuid(), substr(h, 1, 24), 300, now(), h || h, 'BenchJob',
               'default', jsonb_build_array(h), now() - interval '2 days' + i * interval '1 ms',
               now() - interval '2 days' + i * interval '1 ms', ARRAY['BenchJob']
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
      slice = @loaded >= 100_000 ? 2.0 : 0.25
      purger = store(@loaded)
      state = { phase: :without, deleted: 0, seconds: 0.0, cursor: nil, done: false }
      # The claimers deliver through IdempotentJob.perform_once on `claims` (Gem.using);
      # the purger calls its own store.
      samples = Gem.using(claims) do
        CLAIMERS.times { claim } # connections open
        claiming(state) { alternate(purger, state, slice) }
      end
      raise "purge under load deleted #{state[:deleted]} of #{@loaded}" unless state[:deleted] == @loaded

      puts "   #{@loaded} records purged under #{CLAIMERS} claimers in #{state[:seconds].round(2)} s"
      { seconds: state[:seconds], slice:, during: summary(samples[:during]), without: summary(samples[:without]) }
    end

    # Slices of `slice` seconds: without the purge, then purge batches (going on from
    # the cursor), and so on until the purge is done; one more slice without to end.
    # Interleaved, so the machine's drifting load falls on both sides alike.
    def alternate(purger, state, slice)
      until state[:done]
        state[:phase] = :without
        sleep(slice)
        state[:phase] = :during
        state[:seconds] += Clock.seconds { purge_for(purger, state, slice) }
      end
      state[:phase] = :without
      sleep(slice)
    end

    # Purge batches for up to `slice` seconds, from and to state[:cursor].
    def purge_for(purger, state, slice)
      until_at = Clock.now + slice
      while Clock.now < until_at
        deleted, picked, state[:cursor] = purger.purge_batch(3600.0, LOADED_BATCH, state[:cursor])
        state[:deleted] += deleted
        next unless picked < LOADED_BATCH

        state[:done] = true
        break
      end
    end

    # Runs CLAIMERS threads claiming new operations until the block returns, each claim
    # filed under the phase (state[:phase]) it started in.
    # @return [Hash{Symbol => Array<Float>}] claim latencies (µs) by phase
    def claiming(state)
      stop = false
      threads = Array.new(CLAIMERS) do
        Thread.new do
          samples = { without: [], during: [] }
          until stop
            phase = state[:phase]
            started = Clock.now
            claim
            samples[phase] << ((Clock.now - started) * 1e6)
          end
          samples
        end
      end
      yield
      stop = true
      threads.map(&:value).each_with_object({ without: [], during: [] }) do |s, all|
        all.each_key { |phase| all[phase].concat(s[phase]) }
      end
    end

    # One delivery of a new operation through IdempotentJob.perform_once (see {Gem.using}).
    def claim
      decision = Gem.deliver(Op.fresh)
      raise "a new delivery decided #{decision.inspect}" unless decision == :ran
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
      @results.table("purge", "7. Purge: seconds by records due, alone and under claims",
                     ["records", "seconds", "× smallest", "size ×", "target"], rows, notes:)
    end

    def loaded_row(loaded, p99)
      ["#{@loaded} under #{CLAIMERS} claimers (batch #{LOADED_BATCH})", Format.num(loaded[:seconds], 2),
       "claim p50 / p99 µs: #{claims(loaded[:during])} with purge, #{claims(loaded[:without])} without",
       "p99 #{Format.ratio(p99)}", Format.verdict(p99 <= TARGET_P99, "p99 ≤ #{TARGET_P99}× without")]
    end

    def record(alone, loaded, per_record, p99)
      alone.each { |n, s| @results.add("purge", "alone", "seconds_#{n}_records", s, "s") }
      @results.add("purge", "alone", "time_per_record_ratio_largest_to_smallest", per_record, "x",
                   "#{alone.keys.max} to #{alone.keys.min} records")
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
       "table throughout, in alternating slices of #{@loaded >= 100_000 ? 2 : 0.25} s without and with the purge " \
       "(batch #{LOADED_BATCH}; each purge slice goes on from where the last one stopped), so the machine's " \
       "drifting load falls on both alike; seconds = the purge slices' sum."]
    end
  end
end
