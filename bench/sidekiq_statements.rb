# frozen_string_literal: true

module IdempotentJobBench
  # Table 5b of the Sidekiq section (bench/sidekiq_run.rb, which includes it): each
  # guarded mode's statements from pg_stat_statements, summed over its rounds. Needs
  # @results, @operations and the LABELS constant of the class that includes it.
  module SidekiqStatements
    private

    # Adds a table of each guarded mode's statements, summed over its rounds: calls per
    # operation, execution µs per call and per operation, WAL bytes per call and per operation.
    def statement_report(runs)
      rows = %i[with hand].flat_map do |mode|
        ops = @operations * runs[mode].size
        statement_sums(runs[mode]).sort_by { |_, (_, ms)| -ms }.map do |q, (calls, ms, wal)|
          [self.class::LABELS[mode], q, Format.num(calls.to_f / ops, 3), Format.num(ms * 1e3 / calls),
           Format.num(ms * 1e3 / ops), Format.num(wal.to_f / calls), Format.num(wal.to_f / ops)]
        end
      end
      @results.table("sidekiq", "5b. Server time and WAL per statement, the real Sidekiq runs (pg_stat_statements)",
                     ["worker", "statement", "calls / operation", "execution µs / call", "execution µs / operation",
                      "WAL B / call", "WAL B / operation"],
                     rows, notes: ["summed over each mode's rounds, divided by their operations " \
                                   "(#{@operations} a round, duplicates included in their operation's figures); " \
                                   "WAL: the statement's own records (commit records, ≈ 34 B each, not counted)"])
    end

    # @return [Hash{String => Array(Integer, Float, Integer)}] calls, execution milliseconds
    #   and WAL bytes per statement text over a mode's runs
    def statement_sums(list)
      sums = Hash.new { |h, k| h[k] = [0, 0.0, 0] }
      list.each do |f|
        f["statements"].to_a.each do |q, calls, ms, wal|
          sums[q][0] += calls
          sums[q][1] += ms
          sums[q][2] += wal.to_i
        end
      end
      sums
    end
  end
end
