# frozen_string_literal: true

module IdempotentJobBench
  # Where the server's time goes, per statement, from pg_stat_statements (with
  # `pg_stat_statements.track_planning`, which bin/bench turns on): calls, plans,
  # mean planning and mean execution time. Shows what a variant's statements cost
  # PostgreSQL before any network or disk wait.
  #
  # pg_stat_statements keeps one entry per statement text and role, so the variants
  # that send the same statement unnamed (planned at every call) run as a role of their
  # own, {UNNAMED_ROLE}, and are shown apart: mixed with the named statements they made
  # the gem's warm named statements look re-planned (about one plan per 3.5 calls).
  class ServerTimes
    # The role the unnamed-statement variants run as (created here; needs CREATEROLE).
    UNNAMED_ROLE = "bench_unnamed"

    # Statements of the variants, recognised by their text as pg_stat_statements keeps it
    # (constants replaced by $n), in the order shown.
    STATEMENTS = [
      [/\AWITH look AS/, "delivery: look, or first claim (the gem's statement)"],
      [/\AINSERT INTO idempotent_job_records AS r/, "claim (the gem's takeover/retry statement)"],
      [/\AWITH b AS .*UPDATE idempotent_job_records AS r\s+SET duplicates/m,
       "repeat bookkeeping (batched, async commit)"],
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

    # @param url [String] a PostgreSQL URL
    # @return [String] the URL with the session's role set to {UNNAMED_ROLE} (the
    #   `options` startup parameter), or `url` as given when that role cannot be made
    def unnamed_url(url)
      return url unless unnamed_role

      "#{url}#{url.include?("?") ? "&" : "?"}options=-c%20role%3D#{UNNAMED_ROLE}"
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
      rows = totals.map { |label, t| row(results, section, label, t) }
      results.table(section, title, ["statement", "calls", "plans", "plans / call", "planning µs / plan",
                                     "execution µs / call"], rows, notes: [NOTE])
    end

    # The table's note.
    NOTE = "pg_stat_statements over the timed pass (after every variant's warm-up); execution excludes " \
           "parsing and the commit (its WAL flush); an unnamed statement is planned at every call, a named one " \
           "only for its first calls (the gem's: once per connection, `plan_cache_mode = force_generic_plan`; " \
           "the pg gem's: five custom plans, then the generic one); unnamed: the variants with unnamed " \
           "statements (floor unnamed, gem with prepared_statements: false), counted as a role of their own."

    private

    def row(results, section, label, sums)
      plan = sums[:plans].positive? ? sums[:plan_ms] * 1000 / sums[:plans] : nil
      execution = sums[:exec_ms] * 1000 / sums[:calls]
      per_call = sums[:plans].to_f / sums[:calls]
      results.add(section, label, "server_planning_per_plan", plan, "us", "#{sums[:plans]} plans")
      results.add(section, label, "server_execution_per_call", execution, "us", "#{sums[:calls]} calls")
      results.add(section, label, "plans_per_call", per_call, "count", "#{sums[:plans]} plans, #{sums[:calls]} calls")
      [label, sums[:calls].to_s, sums[:plans].to_s, Format.num(per_call, 3), Format.num(plan), Format.num(execution)]
    end

    def totals
      labels = STATEMENTS.flat_map { |_, label| [label, "#{label}, unnamed"] }
      sums = labels.to_h { |label| [label, { calls: 0, plans: 0, plan_ms: 0.0, exec_ms: 0.0 }] }
      @db.exec("SELECT query, calls, plans, total_plan_time, total_exec_time, " \
               "userid = (SELECT oid FROM pg_roles WHERE rolname = $1) AS unnamed FROM pg_stat_statements " \
               "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
               [UNNAMED_ROLE]).each do |row|
        label = STATEMENTS.find { |pattern, _| row["query"].match?(pattern) }&.last
        next unless label

        add(sums[row["unnamed"] == "t" ? "#{label}, unnamed" : label], row)
      end
      sums.select { |_, t| t[:calls].positive? }
    end

    def add(sum, row)
      sum[:calls] += row["calls"].to_i
      sum[:plans] += row["plans"].to_i
      sum[:plan_ms] += row["total_plan_time"].to_f
      sum[:exec_ms] += row["total_exec_time"].to_f
    end

    # Creates {UNNAMED_ROLE} (once) with what the variants need of the record table.
    # @return [Boolean] whether the role exists now
    def unnamed_role
      @db.exec(<<~SQL)
        DO $$ BEGIN
          IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '#{UNNAMED_ROLE}') THEN
            CREATE ROLE #{UNNAMED_ROLE} NOLOGIN;
          END IF;
        END $$
      SQL
      @db.exec("GRANT #{UNNAMED_ROLE} TO CURRENT_USER")
      @db.exec("GRANT USAGE ON SCHEMA public TO #{UNNAMED_ROLE}")
      @db.exec("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO #{UNNAMED_ROLE}")
      true
    rescue PG::Error
      false
    end
  end
end
