# frozen_string_literal: true

require "etc"
require "time"

module Soak
  # The run's report: what was done to the gem (operations, deliveries, duplicates,
  # kills, the PostgreSQL restart), what it did (duplicates turned away, takeovers,
  # held, given up), per job type, the held and given-up operations with their reasons,
  # and every violation.
  class Report
    # Held, given-up operations and violations shown on the console (report.txt lists all).
    LIST_LIMIT = 50

    # Everything the report shows, gathered by {Run}.
    Facts = Struct.new(:command, :control, :versions, :timings, :plan, :producer, :fleet, :postgres, :counts, :checker,
                       :evidence, :log_scan, :resolutions, :problems, keyword_init: true)

    # @param facts [Facts]
    def initialize(facts)
      @f = facts
      @results = facts.checker.results
    end

    # @return [Array<String>] every violation: per operation, across operations, in the logs
    def violations
      @violations ||= @f.problems + @f.checker.violations + @f.fleet.deaths +
                      @f.log_scan.unexpected.map { |finding| "unexpected log line #{finding}" }
    end

    # @param limit [Integer, nil] list at most this many held/given-up operations and
    #   violations; nil for all
    # @return [String] the report
    def to_s(limit: nil)
      [header, "", summary_table, "", type_table, "", *settled(limit), "", *violation_lines(limit)].join("\n")
    end

    private

    def header
      started = Time.at(@f.timings[:started_at]).utc
      ["idempotent_job soak and chaos run — #{started.strftime("%Y-%m-%d %H:%M UTC")}",
       "machine: #{machine}",
       "command: #{@f.command}",
       *("CONTROL RUN: the gem's server middleware removed, so violations are expected" if @f.control),
       format("wall time: %<total>.0f s (enqueue and chaos %<phase>.0f s, drain %<drain>.0f s, " \
              "checks %<check>.0f s)", **@f.timings.slice(:total, :phase, :drain, :check))].join("\n")
    end

    def machine
      os = File.read("/etc/os-release")[/PRETTY_NAME="([^"]+)"/, 1] if File.exist?("/etc/os-release")
      "#{os || RUBY_PLATFORM}, #{Etc.nprocessors} cores, Ruby #{RUBY_VERSION}, Sidekiq #{::Sidekiq::VERSION}, " \
        "#{@f.versions}"
    end

    def summary_table
      rows = deliveries_rows + decisions_rows + faults_rows + outcome_rows
      width = rows.map { |label, _, _| label.size }.max
      rows.map { |label, value, note| "#{label.ljust(width)}  #{value.to_s.rjust(7)}#{"  #{note}" if note}" }
          .join("\n")
    end

    def deliveries_rows
      dups = @f.plan.duplicates_by_kind
      requeued = @f.fleet.kills.sum { |kill| kill.requeued.size }
      [["operations", @f.plan.operations.size, type_counts],
       ["deliveries enqueued by the producer", @f.producer.total,
        "#{@f.plan.operations.size} first + #{dups.values.sum} duplicates: #{dups[:repeat]} repeats, " \
        "#{dups[:concurrent]} concurrent copies, #{dups[:delayed]} delayed re-enqueues"],
       ["deliveries in a killed worker's hands, re-enqueued", requeued, "(Sidekiq 6.4's basic fetch would lose them)"],
       ["re-runs enqueued by the operator", @f.resolutions.count { |_, r| r.as == :rerun }, "(held, effect not done)"],
       ["deliveries that reached a worker", @f.counts["arrived"],
        "(with deferred ones coming back and Sidekiq retries)"]]
    end

    def decisions_rows
      c = @f.counts
      skipped = %w[completed held given_up].to_h { |d| [d, c["skipped:#{d}"].to_i] }
      [["duplicates turned away (records' duplicates)", sum_records("duplicates"),
        "skipped #{skipped.values.sum} (completed #{skipped["completed"]}, held #{skipped["held"]}, given up " \
        "#{skipped["given_up"]}), deferred behind a live claim #{c["deferred"].to_i}"],
       ["claims", %w[first retry takeover].sum { |k| c["claimed:#{k}"].to_i },
        "first #{c["claimed:first"].to_i}, retry #{c["claimed:retry"].to_i}, takeover #{c["claimed:takeover"].to_i} " \
        "(transactional claims counted before their commit)"]]
    end

    def faults_rows
      kills = @f.fleet.kills
      after_effect = @f.checker.orphaned_effects.fetch(:kill, [])
      [["workers SIGKILLed (each restarted)", kills.size,
        "#{kills.count { |kill| kill.requeued.any? }} with deliveries in hand"],
       ["  effect calls a kill landed after, before completion", after_effect.size,
        "(by #{after_effect.map { |call| call["worker"] }.uniq.size} distinct kills)"],
       ["PostgreSQL restarts", @f.postgres.restarts.size, restart_times],
       ["  completions lost while PostgreSQL restarted", @f.checker.orphaned_effects.fetch(:restart, []).size,
        "(body ran, record stayed claimed)"],
       ["deliveries failed and retried by Sidekiq", failures.values.sum,
        failures.map { |error, n| "#{error} #{n}" }.join(", ")]]
    end

    def restart_times
      @f.postgres.restarts.map do |from, to|
        format("%<at>.0f s into the run, down %<down>.1f s", at: from - @f.timings[:started_at], down: to - from)
      end.join("; ")
    end

    def failures
      @f.evidence.journal.select { |e| e["kind"] == "failed" }.map { |e| e["error"] }.tally
    end

    def outcome_rows
      [["takeovers of stale claims (records' takeovers)", sum_records("takeovers"), takeovers_by_type],
       held_row, given_up_row,
       [":reclaim duplicate effects", extra_effects(@results.select { |r| policy(r) == :reclaim }),
        "each after a kill that landed after the effect, or a completion lost in the restart"],
       ["worker log warnings and errors, expected", @f.log_scan.expected.values.sum,
        @f.log_scan.expected.map { |what, n| "#{what} #{n}" }.join("; ")],
       ["worker log warnings and errors, unexpected", @f.log_scan.unexpected.size],
       ["violations", violations.size, violations.empty? ? "PASS" : "FAIL"]]
    end

    def held_row
      held = @f.resolutions.values.map(&:as).tally
      ["held for a person, then settled", @f.resolutions.size,
       "effect seen at the stand-in → resolved done #{held[:done].to_i}; not seen → rerun #{held[:rerun].to_i}"]
    end

    def given_up_row
      given_up = @results.select { |r| r.status == "given_up" }
      ["given up (:skip)", given_up.size,
       "effect made by the dead holder #{given_up.count { |r| r.effects == 1 }}, " \
       "missed #{given_up.count { |r| r.effects.zero? }}"]
    end

    def policy(result)
      JOB_TYPES.fetch(result.operation.job_class)
    end

    def extra_effects(results)
      results.sum { |r| [r.effects - 1, 0].max }
    end

    def type_counts
      @f.plan.operations.map(&:job_class).tally.map { |k, v| "#{k.delete_prefix("Soak::")} #{v}" }.join(", ")
    end

    def takeovers_by_type
      records_by_type.map { |type, records| "#{type.delete_prefix("Soak::")} #{records.sum { |r| r["takeovers"] }}" }
                     .join(", ")
    end

    def records_by_type
      @f.evidence.records.values.group_by { |r| r["job_type"] }.sort.to_h
    end

    def sum_records(column)
      @f.evidence.records.values.sum { |r| r[column].to_i }
    end

    # Columns of the table by job type.
    TYPE_COLUMNS = ["job type", "policy", "operations", "completed", "held→settled", "given up", "other", "effects",
                    "extra effects", "takeovers", "dups turned away"].freeze

    def type_table
      rows = [TYPE_COLUMNS, *@results.group_by { |r| r.operation.job_class }.sort.map { |_, list| type_row(list) }]
      widths = TYPE_COLUMNS.each_index.map { |i| rows.map { |row| row[i].to_s.size }.max }
      lines = rows.map { |row| row.each_with_index.map { |v, i| v.to_s.ljust(widths[i]) }.join("  ").rstrip }
      lines.insert(1, widths.map { |w| "-" * w }.join("  ")).join("\n")
    end

    def type_row(results)
      completed, given_up = %w[completed given_up].map { |status| results.count { |r| r.status == status } }
      [results.first.operation.job_class, policy(results.first), results.size, completed,
       results.count { |r| @f.resolutions.key?(r.operation.reference) }, given_up,
       results.size - completed - given_up, results.sum(&:effects), extra_effects(results),
       *record_sums(results)]
    end

    # @return [Array(Integer, Integer)] the records' takeovers and duplicates
    def record_sums(results)
      records = results.filter_map { |r| @f.evidence.records[r.operation.reference] }
      %w[takeovers duplicates].map { |column| records.sum { |r| r[column] } }
    end

    def settled(limit)
      lines = @results.select { |r| @f.resolutions.key?(r.operation.reference) || r.status == "given_up" }.map do |r|
        held = @f.resolutions[r.operation.reference]
        outcome = held ? "held, resolved as #{held.as}" : "given up"
        "  #{r.operation.reference}: #{outcome}; effect calls #{r.effects}; why: #{r.reason || "UNEXPLAINED"}"
      end
      return ["held and given-up operations: none"] if lines.empty?

      ["held and given-up operations (#{lines.size}):", *capped(lines, limit)]
    end

    def violation_lines(limit)
      return ["no violations"] if violations.empty?

      ["VIOLATIONS (#{violations.size}):", *capped(violations.map { |v| "  #{v}" }, limit)]
    end

    def capped(lines, limit)
      return lines if limit.nil? || lines.size <= limit

      [*lines.first(limit), "  … #{lines.size - limit} more (report.txt lists all)"]
    end
  end
end
