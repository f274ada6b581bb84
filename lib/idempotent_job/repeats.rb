# frozen_string_literal: true

require_relative "repeats/classifier"
require_relative "repeats/report"

module IdempotentJob
  # The repeats report: operations delivered more than once, each repeat classified from
  # the facts recorded with it ({Repeats::Classifier}: concurrent copy, queue retry,
  # redelivery/restart, re-enqueue by the same or another producer), grouped by job type
  # and by pair of producers ({Repeats::Report}). Reads `idempotent_job_records` (see
  # {IdempotentJob.repeats_sql}); writes nothing.
  module Repeats
    # One repeated operation (see {Report::Operation}).
    Operation = Report::Operation

    class << self
      # @param since [Time, Numeric] operations repeated at or after this time (a Time or
      #   epoch seconds)
      # @param job_type [String, nil] only this job type
      # @param restarts [Array<Time, Numeric>] recorded deploy/restart times (Times or
      #   epoch seconds)
      # @param restart_window [Numeric] seconds after a restart within which a redelivery
      #   is matched to it
      # @return [Report]
      # @raise [ConfigurationError] for a `since` or `restarts` that is not a time (a String
      #   is refused: read as a number it would be 0 or a year, and the report silently
      #   wrong), a negative `restart_window`, a `job_type` that is not valid UTF-8
      # @raise [ConnectionError, DatabaseError]
      def report(since:, job_type: nil, restarts: [], restart_window: Native::DEFAULT_RESTART_WINDOW)
        since = time(since) { |got| "since must be a Time or epoch seconds, got #{got}" }
        unless restarts.is_a?(Array)
          raise ConfigurationError, "repeats: restarts must be an Array of Times, got #{restarts.inspect[0, 100]}"
        end

        restarts = restarts.map { |t| time(t) { |got| "restarts must be Times or epoch seconds, got #{got}" } }
        job_type = IdempotentJob.job_type_text(job_type) unless job_type.nil?
        rows = IdempotentJob.store.repeats(since.to_f, job_type).map { |row| Report.row(row) }
        Report.new(rows, restarts:, restart_window:)
      end

      # @return [Array<Operation>] {report}'s operations (same arguments)
      def operations(**options)
        report(**options).operations
      end

      # @param operations [Array<Operation>]
      # @return [Hash{String => Hash}] per job type (see {Report.summary})
      def summary(operations)
        Report.summary(operations)
      end

      private

      # A Time (or anything with `to_time`: DateTime, ActiveSupport's TimeWithZone) or epoch
      # seconds as a Time; else ConfigurationError with the block's words.
      def time(value)
        return value if value.is_a?(Time)
        return Time.at(value) if value.is_a?(Numeric) && value.real? && value.to_f.finite?
        return value.to_time if !value.is_a?(String) && value.respond_to?(:to_time)

        raise ConfigurationError, "repeats: #{yield(value.inspect[0, 100])}"
      end
    end
  end
end
