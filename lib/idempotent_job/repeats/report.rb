# frozen_string_literal: true

require "json"
require "time"
require_relative "classifier"

module IdempotentJob
  module Repeats
    # The repeats report built on delivery facts: each repeated operation with its
    # repeats classified ({Classifier}), a summary per job type, the pairs of producers
    # that enqueue the same operations, as text lines and as CSV. The core computes the
    # classification, the summary and the text (crates/core/src/repeats/report.rs), so
    # Python's `idempotent_job.repeats_report` prints the same report. Pure: it is given
    # the rows (what the report's SQL read) and computes; it reads and writes nothing.
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

      # CSV columns, one row per repeat (the core's).
      CSV_HEADERS = Native::REPEATS_CSV_HEADERS

      # How deep the JSON of deliveries and repeat elements may nest: the facts a claim
      # accepted (the core's Native::MAX_NESTING levels) inside a deliveries array or a
      # repeat element object (two levels more). Ruby's JSON stops at 100 by default.
      JSON_NESTING = Native::MAX_NESTING + 2

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
        row.merge(deliveries: JSON.parse(deliveries, max_nesting: JSON_NESTING))
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
        nesting = { max_nesting: JSON_NESTING }
        # Keywords, not a positional Hash: json 3 (Ruby 3.3) takes JSON.parse's options as keywords only.
        JSON.parse(Native.repeat_deliveries(first_claimed_at.to_f, first_facts && JSON.generate(first_facts, **nesting),
                                            JSON.generate(repeat_facts, **nesting)), **nesting)
      end

      # @param rows [Array<Hash>] per operation: :job_type, :operation_key, :status,
      #   :completed_at (Time or nil) and :deliveries (Array of fact Hashes in arrival
      #   order, the first claim's first; see {Classifier})
      # @param restarts [Array<Time>] recorded deploy/restart times
      # @param restart_window [Numeric] seconds after a restart that a redelivery is matched
      # @raise [ConfigurationError] for facts JSON cannot carry or a negative window
      def initialize(rows, restarts: [], restart_window: Native::DEFAULT_RESTART_WINDOW)
        # Checked once, repeats or none: no number of seconds (true, nil, "90") is refused.
        restart_window = Native.restart_window(restart_window)
        @operations = rows.map do |row|
          deliveries = row.fetch(:deliveries)
          first_at = Classifier.seconds(deliveries.first&.fetch("at", nil))
          Operation.new(
            **row.slice(*Operation.members), first_claimed_at: first_at && Time.at(first_at),
                                             producers: deliveries.filter_map { |d| d["producer"] }.uniq,
                                             job_classes: row[:job_classes] || [],
                                             replays: deliveries.count { |d| d["replayed"] },
                                             repeats: Classifier.classify(deliveries, completed_at: row[:completed_at],
                                                                                      restarts:, restart_window:)
          )
        end
        @printed = self.class.printed(@operations)
        @operations.zip(@printed.fetch("notes")) { |op, notes| op.notes = notes }
      end

      # The core's report of `operations` (`Native.repeats_report`): "notes" (per
      # operation), "summary", "producer_pairs", "lines" and "csv", computed once.
      # @param operations [Array<Operation>] (or any objects with its members)
      # @return [Hash{String => Object}]
      # @raise [ConfigurationError] for a member JSON cannot carry
      def self.printed(operations)
        JSON.parse(Native.repeats_report(JSON.generate(operations.map { |op| operation_json(op) })))
      rescue JSON::GeneratorError => e
        raise ConfigurationError, "the repeated operations cannot be read as JSON: #{e.message}"
      end

      # An operation as the core reads it: times in epoch seconds, Symbols as text.
      def self.operation_json(operation)
        member = ->(name) { operation.respond_to?(name) ? operation.public_send(name) : nil }
        { job_type: member[:job_type].to_s, operation_key: member[:operation_key].to_s, status: member[:status].to_s,
          takeovers: member[:takeovers].to_i, mismatches: member[:mismatches].to_i, replays: member[:replays].to_i,
          producers: member[:producers].to_a.compact, job_classes: member[:job_classes].to_a,
          repeats: member[:repeats].to_a.map { |r| repeat_json(r) } }
      end
      private_class_method :operation_json

      # A {Classifier::Repeat} as the core reads it.
      def self.repeat_json(repeat)
        repeat.to_h.merge(at: repeat.at&.to_f, restart: repeat.restart&.to_f, cause: repeat.cause.to_s)
      end
      private_class_method :repeat_json

      # @param operations [Array<Operation>]
      # @return [Hash{String => Hash{Symbol => Integer}}] per job type (the order they
      #   first appear): operations, repeats (deferred returns left out), one count per
      #   cause of {Classifier::CAUSES}, near_restart (redeliveries matched to a
      #   restart), deferred_returns, several_producers (operations enqueued by more than
      #   one), takeovers, held, mismatched (operations with different payloads), replays
      #   (repeats answered with a stored result: see `store_result`). The core counts.
      def self.summary(operations)
        summary_of(printed(operations))
      end

      # The core's summary array as {summary}'s Hash.
      def self.summary_of(printed)
        printed.fetch("summary").to_h.transform_values { |counts| counts.to_h.transform_keys(&:to_sym) }
      end
      private_class_method :summary_of

      # @return [Hash{String => Hash{Symbol => Integer}}] {Report.summary} of this report
      def summary
        self.class.send(:summary_of, @printed)
      end

      # @return [Hash{Array(String, String, String) => Integer}] per [job_type, producer,
      #   producer], the operations both producers enqueued, most first
      def producer_pairs
        @printed.fetch("producer_pairs").to_h { |type, a, b, count| [[type, a, b], count] }
      end

      # @return [Array<String>] the report as text (the core's): one line per operation,
      #   then per job type, then per pair of producers
      def lines
        @printed.fetch("lines")
      end

      # @return [String] one CSV row per repeat, with {CSV_HEADERS} (the core's); text
      #   cells that start like a formula (`=`, `+`, `-`, `@`, tab, CR: OWASP's CSV
      #   injection list) get a leading single quote, so they open as text
      def to_csv
        @printed.fetch("csv")
      end
    end
  end
end
