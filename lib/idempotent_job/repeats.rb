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
      # @param since [Time] operations repeated at or after this time
      # @param job_type [String, nil] only this job type
      # @param restarts [Array<Time>] recorded deploy/restart times
      # @param restart_window [Numeric] seconds after a restart within which a redelivery
      #   is matched to it
      # @return [Report]
      # @raise [ConnectionError, DatabaseError]
      def report(since:, job_type: nil, restarts: [], restart_window: Native::DEFAULT_RESTART_WINDOW)
        rows = IdempotentJob.store.repeats(since.to_f, job_type&.to_s).map { |row| Report.row(row) }
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
    end
  end
end
