# frozen_string_literal: true

module IdempotentJob
  # The repeats report: operations delivered more than once, each repeat classified the
  # way an operator reasons about it. Reads `idempotent_job_records` (see
  # {IdempotentJob.repeats_sql}); writes nothing.
  module Repeats
    # One repeated operation.
    #
    # Members: job_type, operation_key (String), status (Symbol), attempts, takeovers,
    # duplicates, mismatches (Integer), first_claimed_at (Time), repeats (Array of
    # Hashes `{at: Time, after: seconds since the first claim, cause: :retry |
    # :re_enqueue | :restart}`, the last 20), job_classes (Array of String), notes
    # (Array of String: several producers, different payloads, held…).
    Operation = Struct.new(:job_type, :operation_key, :status, :attempts, :takeovers, :duplicates, :mismatches,
                           :first_claimed_at, :repeats, :job_classes, :notes, keyword_init: true)

    class << self
      # @param since [Time] repeats at or after this time
      # @param job_type [String, nil] only this job type
      # @param restarts [Array<Time>] recorded deploy/restart times
      # @param restart_window [Numeric] seconds around a restart that make a repeat a :restart
      # @param retry_window [Numeric] seconds after the first claim within which a repeat is a
      #   :retry; later ones are :re_enqueue
      # @return [Array<Operation>]
      def operations(since:, job_type:, restarts:, restart_window:, retry_window:)
        IdempotentJob.store.repeats(since.to_f, job_type&.to_s).map do |row|
          repeats = row[:repeat_times].map do |at|
            after = at - row[:first_claimed_at]
            { at:, after:, cause: cause(at, after, restarts, restart_window, retry_window) }
          end
          Operation.new(**row.except(:repeat_times), repeats:, notes: notes(row))
        end
      end

      # @param operations [Array<Operation>]
      # @return [Hash{String => Hash}] per job type: operations, repeats, retry,
      #   re_enqueue, restart, takeovers, held, mismatched, several_producers
      def summary(operations)
        operations.group_by(&:job_type).transform_values do |ops|
          causes = ops.flat_map { |op| op.repeats.map { |r| r[:cause] } }.tally
          { operations: ops.size, repeats: ops.sum { |op| op.repeats.size },
            retry: causes.fetch(:retry, 0), re_enqueue: causes.fetch(:re_enqueue, 0),
            restart: causes.fetch(:restart, 0), takeovers: ops.sum(&:takeovers),
            held: ops.count { |op| op.status == :held }, mismatched: ops.count { |op| op.mismatches.positive? },
            several_producers: ops.count { |op| op.job_classes.size > 1 } }
        end
      end

      private

      def cause(at, after, restarts, restart_window, retry_window)
        return :restart if restarts.any? { |r| (at - r).abs <= restart_window }

        after <= retry_window ? :retry : :re_enqueue
      end

      def notes(row)
        notes = []
        notes << "delivered by #{row[:job_classes].size} job classes: #{row[:job_classes].join(", ")}" if
          row[:job_classes].size > 1
        notes << "#{row[:mismatches]} deliveries with different arguments (payload digest)" if
          row[:mismatches].positive?
        notes << "#{row[:takeovers]} stale claims taken over" if row[:takeovers].positive?
        notes << "held for a person" if row[:status] == :held
        notes
      end
    end
  end
end
