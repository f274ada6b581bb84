# frozen_string_literal: true

module IdempotentJobBench
  # The last table: issues 14, 21 and 25's targets, each with the figure this run measured (from
  # the sections' records) and whether it is met. A target whose section did not run
  # is left out.
  class Targets
    # @param results [Results] the run's results so far
    def initialize(results)
      @results = results
    end

    # Adds the table to the results.
    # @return [void]
    def report
      rows = ROWS.filter_map { |text, rule| row(text, rule) }
      return if rows.empty?

      @results.table("targets", "Targets (issues 14, 21 and 25): this run's figures",
                     ["target", "this run", "verdict"], rows,
                     notes: ["ratios within this run (variants interleaved); a loaded machine moves them."])
    end

    # Each target: its text, and how to read it from the records.
    ROWS = [
      ["first delivery: perform_once ≤ 1.10× the floor", [:ratio, "first", "gem", "ratio_p50_to_floor", :<=, 1.10]],
      ["first delivery: middleware ≤ 1.20× the floor",
       [:ratio, "first", "middleware", "ratio_p50_to_floor", :<=, 1.20]],
      ["gem overhead with synchronous_commit off ≤ 1.20× its floor",
       [:ratio, "first", "gem_nosync", "ratio_p50_to_floor_nosync", :<=, 1.20]],
      ["duplicate: middleware ≤ 1.30× one raw round trip",
       [:ratio, "duplicate", "middleware", "ratio_p50_to_round_trip", :<=, 1.30]],
      ["duplicate: perform_once and middleware faster than the hand-written version", [:faster]],
      ["no re-planning: the gem's named statements, plans per call after warm-up ≈ 0", [:plans]],
      ["10 threads ≥ 1.0× raw pg", [:ratio, "throughput", "gem", "ratio_to_raw_10_threads", :>=, 1.0]],
      ["a real Sidekiq process, 10,000 operations + 30 % duplicates: worker side ≥ 1.2× " \
       "sidekiq-unique-jobs' 2,375 jobs/s", [:ratio, "sidekiq", "with_middleware", "ratio_to_peer", :>=, 1.2]],
      ["(issue 21) the same Sidekiq run: the gem's drain ≤ 1.10× a hand-written guard's (same run, rotating)",
       [:ratio, "sidekiq", "with_middleware", "drain_ratio_to_hand_written", :<=, 1.10]],
      ["memory ≤ 10 MB for the native runtime and pool",
       [:value, "memory", "gem", "added_by_gem_runtime_pool", :<=, 10, "MB"]],
      ["(issue 25) purge time per record, largest table ≤ 1.25× smallest (800k in about 8× the time of 100k)",
       [:ratio, "purge", "alone", "time_per_record_ratio_largest_to_smallest", :<=, 1.25]],
      ["(issue 25) claim p99 while a purge runs (10 claimers) ≤ 1.2× without",
       [:ratio, "purge", "loaded", "claim_p99_ratio", :<=, 1.2]]
    ].freeze

    private

    def row(text, rule)
      case rule.first
      when :ratio, :value then limit_row(text, rule)
      when :faster then faster_row(text)
      when :plans then plans_row(text)
      end
    end

    def value(section, subject, metric)
      @results.records.find { |r| r.section == section && r.subject.to_s == subject && r.metric.to_s == metric }&.value
    end

    # rule: [kind (:ratio or :value), section, subject, metric, comparison, limit, unit]
    def limit_row(text, rule)
      kind, section, subject, metric, comparison, limit, unit = rule
      figure = value(section, subject, metric)
      return nil if figure.nil?

      shown = kind == :ratio ? Format.ratio(figure) : "#{Format.num(figure, 1)} #{unit}"
      shown += sidekiq_detail(metric) if section == "sidekiq"
      [text, shown, verdict(figure.public_send(comparison, limit))]
    end

    def sidekiq_detail(metric)
      if metric == "drain_ratio_to_hand_written"
        gem, hand = %w[with_middleware hand_written].map { |s| Format.num(value("sidekiq", s, "drain_seconds"), 2) }
        return " (drain #{gem} s with the gem, #{hand} s hand-written; medians)"
      end

      with = value("sidekiq", "with_middleware", "jobs_per_s")
      without = value("sidekiq", "without_middleware", "jobs_per_s")
      " (#{Format.num(with)} jobs/s with the middleware, #{Format.num(without)} without)"
    end

    def faster_row(text)
      hand = value("duplicate", "hand_written", "p50")
      gem = value("duplicate", "gem", "p50")
      middleware = value("duplicate", "middleware", "p50")
      return nil unless hand && gem && middleware

      shown = "perform_once #{Format.num(gem)} µs, middleware #{Format.num(middleware)} µs, " \
              "hand-written #{Format.num(hand)} µs"
      [text, shown, verdict(gem < hand && middleware < hand)]
    end

    PLANNED = "delivery: look, or first claim (the gem's statement)"
    private_constant :PLANNED

    def plans_row(text)
      figures = %w[first duplicate].filter_map { |s| value(s, PLANNED, "plans_per_call") }
      return nil if figures.empty?

      shown = "#{figures.map { |f| Format.num(f, 3) }.join(" / ")} (delivery statement, first / duplicate)"
      [text, shown, verdict(figures.all? { |f| f < 0.01 })]
    end

    def verdict(met)
      met ? "met" : "MISSED"
    end
  end
end
