# frozen_string_literal: true

require "time"

module Demo
  # The demo's repeats per scenario, as the repeats report classifies them from the facts
  # recorded with each delivery (IdempotentJob::Repeats.report), beside what each scenario
  # did. Deferred copies coming back are not counted (they keep their first arrival's cause).
  class RepeatsTable
    # What each scenario's repeats are, per cause: the deliveries it made after the first.
    EXPECTED = {
      "(a)" => { "re-enqueue, same producer" => 2 },         # enqueued again after it completed, same line
      "(b)" => { "concurrent copy" => 4 },                   # five copies met the live claim of one
      "(c)" => { "redelivery/restart" => 1 },                # the same jid again
      "(d)" => { "redelivery/restart" => 1 },                # took over the killed worker's claim
      "(f)" => { "concurrent copy" => 1 },                   # two pushes at once, keys in another order
      "(g)" => { "redelivery/restart" => 1 },                # took over the killed worker's claim (held)
      "(h)" => { "concurrent copy" => 4 },                   # waited on the transactional claim's row lock
      "(j)" => { "re-enqueue, other producer" => 1 },        # the webhook after the controller
      "(k)" => { "concurrent copy" => 3, "redelivery/restart" => 1 }, # 2 perform_later + 1 job_id, its copy
      "(l)" => { "re-enqueue" => 2 },                        # Celery: sent again after it completed (no producer)
      "(m)" => { "concurrent copy" => 4 },                   # Celery: five copies met the live claim of one
      "(n)" => { "redelivery/restart" => 1 }                 # Celery: took over the killed pool child's claim
    }.freeze

    # @param state [State]
    # @param restarts [Array<Time>] when the killed worker's replacement started
    def initialize(state, restarts:)
      @state = state
      @report = IdempotentJob::Repeats.report(since: Time.now - 3600, restarts:, restart_window: 60)
    end

    # @return [Array<String>] the table, then how many scenarios read as expected
    def lines
      rows = @state.operations.uniq(&:scenario).filter_map { |op| row(op) }
      right = rows.count { |r| r["as expected"] == "yes" }
      [*Table.lines(rows), "", "repeats classified as expected: #{right} of #{rows.size} scenarios"]
    end

    private

    def row(operation)
      letter = operation.scenario[0, 3]
      expected = EXPECTED[letter] or return
      found = @report.operations.find do |op|
        op.job_type == operation.job_class.name && op.operation_key == operation.key
      end
      counted = found ? found.repeats.reject(&:deferred_return) : []
      causes = counted.map { |r| IdempotentJob::Repeats::Classifier::LABELS.fetch(r.cause) }.tally
      { "scenario" => operation.scenario, "repeats" => counted.size, "classified as" => text(causes),
        "details" => details(counted, found), "as expected" => causes == expected ? "yes" : "NO (#{text(expected)})" }
    end

    def text(causes)
      causes.map { |label, n| "#{n} #{label}" }.join(", ")
    end

    def details(repeats, operation)
      restart = repeats.filter_map(&:restart).first
      return "near the worker's restart at #{restart.utc.strftime("%T")}" if restart

      other = repeats.any? { |r| r.cause == :re_enqueue_other_producer }
      other ? "producers: #{operation.producers.join(" and ")}" : ""
    end
  end

  # A plain text table of Hashes with String keys (the columns, in the first row's order).
  module Table
    module_function

    def lines(rows)
      return [] if rows.empty?

      columns = rows.first.keys.grep(String)
      widths = columns.to_h { |c| [c, [c.size, *rows.map { |r| r[c].to_s.size }].max] }
      line = ->(values) { columns.map { |c| values[c].to_s.ljust(widths[c]) }.join("  ").rstrip }
      [line.call(columns.to_h { |c| [c, c] }), line.call(columns.to_h { |c| [c, "-" * widths[c]] }),
       *rows.map { |r| line.call(r) }]
    end
  end
end
