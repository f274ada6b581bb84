# frozen_string_literal: true

module IdempotentJobBench
  # Where the server's time goes, per statement, from pg_stat_statements (with
  # `pg_stat_statements.track_planning`, which bin/bench turns on): calls, plans,
  # mean planning and mean execution time. Shows what a variant's statements cost
  # PostgreSQL before any network or disk wait.
  class ServerTimes
    # Statements of the variants, recognised by their text as pg_stat_statements keeps it
    # (constants replaced by $n), in the order shown.
    STATEMENTS = [
      [/\AWITH look AS/, "delivery: look, or first claim (the gem's statement)"],
      [/\AINSERT INTO idempotent_job_records AS r/, "claim (the gem's takeover/retry statement)"],
      [/\AUPDATE idempotent_job_records AS r\s+SET duplicates/, "repeat bookkeeping (batched, async commit)"],
      [/\AUPDATE idempotent_job_records SET status = \S+, completed_at.*set_config/m, "completion, async commit (A)"],
      [/\AUPDATE idempotent_job_records SET status = \S+, completed_at/, "completion (the gem's statement)"],
      [/\AINSERT INTO bench_handwritten_jobs/, "hand-written insert"],
      [/\ASELECT status, token/, "hand-written read"],
      [/\AUPDATE bench_handwritten_jobs SET status/, "hand-written completion"],
      [/\ASELECT status FROM idempotent_job_records/, "PK read (one raw round trip)"]
    ].freeze

    # @param db [Database]
    def initialize(db)
      @db = db
    end

    # Forgets the statistics gathered so far.
    # @return [Boolean] false when pg_stat_statements cannot be reset or read here
    def reset
      return false unless @db.statements?

      @db.exec("SELECT pg_stat_statements_reset()")
      true
    rescue PG::Error
      false
    end

    # Adds a table of the statements seen since {#reset}.
    # @param results [Results]
    # @param section [String]
    # @param title [String]
    # @return [void]
    def report(results, section, title)
      rows = totals.map do |label, t|
        plan = t[:plans].positive? ? t[:plan_ms] * 1000 / t[:plans] : nil
        execution = t[:exec_ms] * 1000 / t[:calls]
        results.add(section, label, "server_planning_per_plan", plan, "us", "#{t[:plans]} plans")
        results.add(section, label, "server_execution_per_call", execution, "us", "#{t[:calls]} calls")
        [label, t[:calls].to_s, t[:plans].to_s, Format.num(plan), Format.num(execution)]
      end
      results.table(section, title, ["statement", "calls", "plans", "planning µs / plan", "execution µs / call"], rows,
                    notes: ["pg_stat_statements over the timed pass; execution excludes parsing and the commit " \
                            "(its WAL flush); an unnamed statement is planned at every call, a named one only " \
                            "for its first calls (then its generic plan is reused)."])
    end

    private

    def totals
      sums = STATEMENTS.to_h { |_, label| [label, { calls: 0, plans: 0, plan_ms: 0.0, exec_ms: 0.0 }] }
      @db.exec("SELECT query, calls, plans, total_plan_time, total_exec_time FROM pg_stat_statements " \
               "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())").each do |row|
        label = STATEMENTS.find { |pattern, _| row["query"].match?(pattern) }&.last
        next unless label

        sum = sums[label]
        sum[:calls] += row["calls"].to_i
        sum[:plans] += row["plans"].to_i
        sum[:plan_ms] += row["total_plan_time"].to_f
        sum[:exec_ms] += row["total_exec_time"].to_f
      end
      sums.select { |_, t| t[:calls].positive? }
    end
  end
end
