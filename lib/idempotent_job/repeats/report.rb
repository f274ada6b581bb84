# frozen_string_literal: true

require "csv"
require "json"
require "time"
require_relative "classifier"

module IdempotentJob
  module Repeats
    # The repeats report built on delivery facts: each repeated operation with its
    # repeats classified ({Classifier}), a summary per job type, the pairs of producers
    # that enqueue the same operations, as text lines and as CSV. Pure: it is given the
    # rows (what the report's SQL read) and computes; it reads and writes nothing.
    class Report
      # One repeated operation.
      # Members: job_type, operation_key (String), status (Symbol), attempts, takeovers,
      # duplicates, mismatches (Integer), first_claimed_at, completed_at (Time or nil),
      # producers (Array of String, the first enqueue's first), job_classes (Array of
      # String), repeats (Array of {Classifier::Repeat}, arrival order), notes (Array of
      # String: several producers or job classes, different payloads, takeovers, held),
      # replays (Integer: repeats answered from a completion made with store_result).
      Operation = Struct.new(:job_type, :operation_key, :status, :attempts, :takeovers, :duplicates, :mismatches,
                             :first_claimed_at, :completed_at, :producers, :job_classes, :repeats, :notes,
                             :replays, keyword_init: true)

      # CSV columns, one row per repeat.
      CSV_HEADERS = %w[job_type operation_key status at cause delivery_id retry_count after_claim_s after_enqueue_s
                       live_claim deferred_return producer first_producer restart_at].freeze

      # @return [Array<Operation>]
      attr_reader :operations

      # A row of the report's SQL (the native layer's Hash) as {#initialize} takes it:
      # its deliveries from the first claim (`first_facts`; its delivery id is also the
      # record's when it was claimed once) and the repeat elements of `repeat_facts`; a
      # record kept before repeat facts existed has only its repeat times (read as
      # repeats without facts). The core reads them (`Native.repeat_row_deliveries`).
      # @param row [Hash] the native row (`first_facts_json`, `repeat_facts_json`: JSON text)
      # @return [Hash] the row with :deliveries
      # @raise [ConfigurationError] for JSON text that does not parse (a damaged record)
      def self.row(row)
        deliveries = Native.repeat_row_deliveries(
          "#{row[:job_type]} #{row[:operation_key].inspect}", row[:first_claimed_at].to_f, row[:first_facts_json],
          row[:repeat_facts_json] || "[]", row[:repeat_times].to_a.map(&:to_f), (row[:jid] if row[:attempts] == 1)
        )
        row.merge(deliveries: JSON.parse(deliveries))
      end

      # An operation's deliveries as {Classifier} reads them, from what the record keeps:
      # the first claim (its time, and its facts when known) and the repeats' elements
      # (`{"at", "job_class", "decision", "facts"}`, put in time order; an element
      # without a decision has no facts). The core's rule (`Native.repeat_deliveries`).
      # @param first_claimed_at [Time]
      # @param first_facts [Hash, nil] the first delivery's door facts
      # @param repeat_facts [Array<Hash>] the record's repeat elements
      # @return [Array<Hash{String => Object}>] fact Hashes with "at" (epoch seconds) and
      #   "decision" ("claimed" for a first claim or a retry's, "takeover" kept)
      def self.deliveries(first_claimed_at:, first_facts:, repeat_facts:)
        JSON.parse(Native.repeat_deliveries(first_claimed_at.to_f, first_facts && JSON.generate(first_facts),
                                            JSON.generate(repeat_facts)))
      end

      # @param rows [Array<Hash>] per operation: :job_type, :operation_key, :status,
      #   :completed_at (Time or nil) and :deliveries (Array of fact Hashes in arrival
      #   order, the first claim's first; see {Classifier})
      # @param restarts [Array<Time>] recorded deploy/restart times
      # @param restart_window [Numeric] seconds after a restart that a redelivery is matched
      def initialize(rows, restarts: [], restart_window: 120)
        @operations = rows.map do |row|
          deliveries = row.fetch(:deliveries)
          first_at = Classifier.seconds(deliveries.first&.fetch("at", nil))
          operation = Operation.new(
            **row.slice(*Operation.members), first_claimed_at: first_at && Time.at(first_at),
                                             producers: deliveries.filter_map { |d| d["producer"] }.uniq,
                                             job_classes: row[:job_classes] || [],
                                             replays: deliveries.count { |d| d["replayed"] },
                                             repeats: Classifier.classify(deliveries, completed_at: row[:completed_at],
                                                                                      restarts:, restart_window:)
          )
          operation.notes = notes(operation)
          operation
        end
      end

      # @param operations [Array<Operation>]
      # @return [Hash{String => Hash{Symbol => Integer}}] per job type: operations,
      #   repeats (deferred returns left out), one count per cause of
      #   {Classifier::CAUSES}, near_restart (redeliveries matched to a restart),
      #   deferred_returns, several_producers (operations enqueued by more than one),
      #   takeovers, held, mismatched (operations with different payloads), replays
      #   (repeats answered with a stored result: see `store_result`)
      def self.summary(operations)
        operations.group_by(&:job_type).transform_values do |ops|
          repeats = ops.flat_map(&:repeats)
          counted = repeats.reject(&:deferred_return)
          causes = counted.map(&:cause).tally
          { operations: ops.size, repeats: counted.size, **Classifier::CAUSES.to_h { |c| [c, causes.fetch(c, 0)] },
            near_restart: counted.count(&:restart), deferred_returns: repeats.size - counted.size,
            **operation_counts(ops) }
        end
      end

      # Per-operation counts of a job type's summary.
      def self.operation_counts(ops)
        { several_producers: ops.count { |op| op.producers.size > 1 }, takeovers: ops.sum { |op| op.takeovers.to_i },
          held: ops.count { |op| op.status == :held }, mismatched: ops.count { |op| op.mismatches.to_i.positive? },
          replays: ops.sum { |op| op.replays.to_i } }
      end
      private_class_method :operation_counts

      # @return [Hash{String => Hash{Symbol => Integer}}] {Report.summary} of this report
      def summary
        self.class.summary(@operations)
      end

      # @return [Hash{Array(String, String, String) => Integer}] per [job_type, producer,
      #   producer], the operations both producers enqueued, most first
      def producer_pairs
        Classifier.producer_pairs(@operations)
      end

      # @return [Array<String>] the report as text: one line per operation, then per job
      #   type, then per pair of producers
      def lines
        @operations.map { |op| operation_line(op) } +
          summary.map { |type, s| summary_line(type, s) } +
          producer_pairs.map do |(type, a, b), count|
            "#{a} and #{b} both enqueue #{type} for the same operation: #{count} operation#{"s" unless count == 1}"
          end
      end

      # A text cell a spreadsheet would read as a formula: it starts with `=`, `+`, `-`,
      # `@`, a tab or a carriage return (OWASP's CSV injection list).
      FORMULA_START = /\A[=+\-@\t\r]/
      # CSV writer option: each text cell that {FORMULA_START} matches gets a leading
      # single quote (OWASP's advice), so an operation key or producer such as
      # `=HYPERLINK(…)` opens as text, never as a formula. Numbers and times are
      # written as they are.
      CSV_NEUTRALISE = ->(cell) { cell.is_a?(String) && cell.match?(FORMULA_START) ? "'#{cell}" : cell }

      # @return [String] one CSV row per repeat, with {CSV_HEADERS}; text cells that
      #   start like a formula are neutralised ({CSV_NEUTRALISE})
      def to_csv
        CSV.generate(write_converters: [CSV_NEUTRALISE]) do |csv|
          csv << CSV_HEADERS
          @operations.each do |op|
            op.repeats.each do |r|
              csv << [op.job_type, op.operation_key, op.status, r.at&.utc&.iso8601(6), r.cause, r.id, r.retry_count,
                      r.after_claim&.round(6), r.after_enqueue&.round(6), r.live_claim, r.deferred_return,
                      r.producer, r.first_producer, r.restart&.utc&.iso8601]
            end
          end
        end
      end

      private

      def notes(operation)
        notes = []
        notes << "enqueued by #{operation.producers.size} producers: #{operation.producers.join(", ")}" if
          operation.producers.size > 1
        notes << "delivered by #{operation.job_classes.size} job classes: #{operation.job_classes.join(", ")}" if
          operation.job_classes.size > 1
        notes << "#{count(operation.mismatches, "delivery", "deliveries")} with different arguments (payload digest)" if
          operation.mismatches.to_i.positive?
        notes << "#{count(operation.takeovers, "stale claim")} taken over" if operation.takeovers.to_i.positive?
        notes << "held for a person" if operation.status == :held
        notes
      end

      # One repeat as text: its cause, when it came, and what else is known of it.
      def repeat_text(repeat)
        # (+ 0.0: a copy whose transaction began a moment before the claim's reads 0.0, not -0.0)
        text = "#{Classifier::LABELS.fetch(repeat.cause)} after #{repeat.after_claim&.round(1)&.+(0.0)} s"
        text += " (deferred copy back)" if repeat.deferred_return
        text += " near the restart at #{repeat.restart.utc.iso8601}" if repeat.restart
        text += " by #{repeat.producer}" if repeat.cause == :re_enqueue_other_producer
        text
      end

      def operation_line(operation)
        repeats = operation.repeats.map { |r| repeat_text(r) }
        "#{operation.job_type} #{operation.operation_key.inspect}: #{operation.status}, " \
          "#{count(operation.repeats.count { |r| !r.deferred_return }, "repeat")} (#{repeats.join(", ")})" \
          "#{"; #{operation.notes.join("; ")}" unless operation.notes.to_a.empty?}"
      end

      # `number` and its noun, singular for one: "1 repeat", "2 repeats".
      def count(number, one, many = "#{one}s") = "#{number} #{number.to_i == 1 ? one : many}"

      def summary_line(job_type, counts)
        causes = Classifier::CAUSES.filter_map do |c|
          "#{counts[c]} #{Classifier::LABELS.fetch(c)}" if counts[c].positive?
        end
        extra = []
        extra << "#{counts[:near_restart]} near a restart" if counts[:near_restart].positive?
        extra << "#{count(counts[:deferred_returns], "deferred copy", "deferred copies")} back" if
          counts[:deferred_returns].positive?
        extra << "#{counts[:several_producers]} enqueued by several producers" if counts[:several_producers].positive?
        extra << "#{counts[:replays]} replayed a stored result" if counts[:replays].positive?
        "#{job_type}: #{count(counts[:operations], "operation")} repeated #{count(counts[:repeats], "time")} — " \
          "#{causes.join(", ")}" \
          "#{"; #{extra.join(", ")}" unless extra.empty?}"
      end
    end
  end
end
