# frozen_string_literal: true

require "open3"

module IdempotentJobBench
  # Section 6: resident memory of a fresh Ruby process before and after the gem's
  # runtime and pool start (bench/memory_probe.rb), and, for comparison, of the pg
  # gem with as many connections.
  class Memory
    # Pooled connections opened by the probe.
    POOL = 10
    # Target: what loading the gem and starting its runtime and pool adds, in MB.
    TARGET_MB = 10
    # The probe script.
    PROBE = File.expand_path("memory_probe.rb", __dir__)

    # @param db [Database]
    # @param results [Results]
    # @param runs [Integer] probe processes per side (medians are reported)
    def initialize(db, results, runs:)
      @db = db
      @results = results
      @runs = runs
    end

    # @return [Hash{String => Hash}] per side ("gem", "pg"): stages (label => kB)
    # @raise [RuntimeError] when a probe fails
    def run
      sides = %w[gem pg].to_h { |mode| [mode, median(Array.new(@runs) { probe(mode) })] }
      report(sides)
      sides
    end

    private

    def probe(mode)
      out, err, status = Open3.capture3({ "DATABASE_URL" => @db.url }, RbConfig.ruby, PROBE, mode, POOL.to_s)
      raise "memory probe #{mode} failed: #{err}" unless status.success?

      JSON.parse(out)
    end

    def median(probes)
      stages = probes.first["stages"].each_with_index.map do |(label, _), i|
        [label, Stats.median(probes.map { |p| p["stages"][i][1] })]
      end
      { stages:, extension_kb: Stats.median(probes.map { |p| p["extension_kb"] }),
        threads: probes.first["threads"] }
    end

    def report(sides)
      rows = sides.flat_map do |mode, side|
        start = side[:stages].first[1]
        side[:stages].map do |label, kb|
          @results.add("memory", mode, label, kb, "kB")
          [mode, label, Format.num(kb / 1024.0, 1), Format.num((kb - start) / 1024.0, 1)]
        end
      end
      gem = sides["gem"][:stages]
      added = (gem[-2][1] - gem.first[1]) / 1024.0
      @results.add("memory", "gem", "added_by_gem_runtime_pool", added, "MB")
      @results.add("memory", "gem", "extension_mapping_rss", sides["gem"][:extension_kb], "kB")
      @results.table("memory", "6. Memory: resident set (VmRSS) of a fresh Ruby process",
                     ["side", "stage", "RSS MB", "Δ MB"], rows, notes: notes(sides, added))
    end

    def notes(sides, added)
      ["gem: require + runtime + pool of #{POOL} connections + 1000 deliveries add #{Format.num(added, 1)} MB " \
       "(#{Format.verdict(added <= TARGET_MB, "≤ #{TARGET_MB} MB")}), of which the extension's own mapped " \
       "code and data #{Format.num(sides["gem"][:extension_kb] / 1024.0, 1)} MB; #{sides["gem"][:threads]} " \
       "threads in the process at the end (Ruby's + the runtime's).",
       "pg: the pg gem with #{POOL} connections, for comparison (libpq and pg_ext mapped: " \
       "#{Format.num(sides["pg"][:extension_kb] / 1024.0, 1)} MB). Medians of #{@runs} processes."]
    end
  end
end
