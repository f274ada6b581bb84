# frozen_string_literal: true

require "csv"
require "etc"
require "fileutils"
require "json"
require "uri"
require "pg"

# The benchmark harness of idempotent_job (`bin/bench`). Every figure is a ratio
# measured in the same run: variants are interleaved in small batches in a random
# order, so drift on a shared machine (other processes, disk flush times) affects
# them alike. See docs/benchmarks.md.
module IdempotentJobBench
  # Monotonic clock helpers.
  module Clock
    # @return [Float] seconds on the monotonic clock
    def self.now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # Runs the block and measures it.
    # @return [Float] elapsed seconds
    def self.seconds
      started = now
      yield
      now - started
    end
  end

  # Order statistics over Arrays of Numerics.
  module Stats
    # @param values [Array<Numeric>] any order; not modified
    # @param fraction [Float] 0.5 for the median, 0.99 for p99
    # @return [Float, nil] the nearest-rank percentile, nil when empty
    def self.percentile(values, fraction)
      return nil if values.empty?

      sorted = values.sort
      sorted[[(fraction * sorted.size).ceil - 1, 0].max].to_f
    end

    # @param values [Array<Numeric>]
    # @return [Float, nil] the median (the mean of the two middle values of an even
    #   count), nil when empty
    def self.median(values)
      return nil if values.empty?

      sorted = values.sort
      middle = sorted.size / 2
      sorted.size.odd? ? sorted[middle].to_f : (sorted[middle - 1] + sorted[middle]) / 2.0
    end

    # @param values [Array<Numeric>]
    # @return [Float, nil] the arithmetic mean, nil when empty
    def self.mean(values)
      values.empty? ? nil : values.sum.to_f / values.size
    end

    # @param numerator [Numeric, nil]
    # @param denominator [Numeric, nil]
    # @return [Float, nil] numerator / denominator, nil when either is missing or the
    #   denominator is zero
    def self.ratio(numerator, denominator)
      return nil if numerator.nil? || denominator.nil? || denominator.to_f.zero?

      numerator.to_f / denominator
    end
  end

  # Number formatting for tables.
  module Format
    # @param value [Numeric, nil]
    # @param digits [Integer] decimals
    # @return [String] the number, or "–" for nil
    def self.num(value, digits = 0)
      return "–" if value.nil?

      digits.zero? ? value.round.to_s : format("%.#{digits}f", value)
    end

    # @param value [Float, nil] a ratio
    # @return [String] e.g. "1.03×", or "–"
    def self.ratio(value)
      value.nil? ? "–" : format("%.2f×", value)
    end

    # @param met [Boolean, nil]
    # @param target [String] the target's text, e.g. "≤ 1.10×"
    # @return [String] "≤ 1.10×: met", "… missed", or "" without a target
    def self.verdict(met, target)
      return "" if target.nil?
      return "#{target}: n/a" if met.nil?

      "#{target}: #{met ? "met" : "MISSED"}"
    end
  end

  # The run's results: printed tables (wide, one per section) and a long-format CSV
  # (one measurement per line) plus a Markdown rendering of the tables.
  class Results
    # One measurement: section name, subject (variant / case), metric name, value
    # (Numeric or String), unit, free-text note.
    Record = Struct.new(:section, :subject, :metric, :value, :unit, :note)
    # A printed table: title, column headers, rows (Arrays of Strings), notes (Strings).
    Table = Struct.new(:section, :title, :headers, :rows, :notes)

    # @return [Array<Record>]
    attr_reader :records
    # @return [Array<Table>]
    attr_reader :tables

    def initialize
      @records = []
      @tables = []
      @timings = []
    end

    # Adds one measurement to the CSV.
    # @param section [String] e.g. "first"
    # @param subject [String, Symbol] e.g. "gem"
    # @param metric [String, Symbol] e.g. "p50"
    # @param value [Numeric, String, nil]
    # @param unit [String] e.g. "us"
    # @param note [String, nil]
    # @return [void]
    def add(section, subject, metric, value, unit, note = nil) # rubocop:disable Metrics/ParameterLists
      value = value.round(4) if value.is_a?(Float)
      @records << Record.new(section, subject, metric, value, unit, note)
    end

    # Adds a table to the printed report and to the Markdown file.
    # @param section [String]
    # @param title [String]
    # @param headers [Array<String>]
    # @param rows [Array<Array<String>>]
    # @param notes [Array<String>] lines printed under the table
    # @return [Table]
    def table(section, title, headers, rows, notes: [])
      Table.new(section, title, headers, rows, notes).tap { |t| @tables << t }
    end

    # Records how long a section took.
    # @param section [String]
    # @param seconds [Float]
    # @return [void]
    def timing(section, seconds)
      @timings << [section, seconds]
      add(section, "harness", "elapsed", seconds, "s")
    end

    # @param table [Table]
    # @return [String] the table as aligned text
    def self.text(table)
      lines = [table.headers, *table.rows].map { |r| r.map(&:to_s) }
      widths = lines.transpose.map { |column| column.map(&:length).max }
      aligned = lines.map { |cells| cells.zip(widths).map { |c, w| c.ljust(w) }.join("  ").rstrip }
      rule = widths.map { |w| "-" * w }.join("  ")
      ["== #{table.title}", aligned.first, rule, *aligned.drop(1), *table.notes.map { |n| "   #{n}" }].join("\n")
    end

    # @param table [Table]
    # @return [String] the table as Markdown
    def self.markdown(table)
      out = ["**#{table.title}**", "", "| #{table.headers.join(" | ")} |",
             "|#{table.headers.map { " --- |" }.join}"]
      out += table.rows.map { |r| "| #{r.map { |c| c.to_s.gsub("|", "\\|") }.join(" | ")} |" }
      out += ["", *table.notes.map { |n| "#{n}  " }] unless table.notes.empty?
      out.join("\n")
    end

    # @return [String] every table, as printed at the end of a run
    def report
      (@tables.map { |t| self.class.text(t) } +
        ["== elapsed: #{@timings.map { |s, t| "#{s} #{t.round}s" }.join(", ")}"]).join("\n\n")
    end

    # Writes results.csv and results.md.
    # @param dir [String] output directory (created)
    # @param header [String] Markdown preamble (machine, date, command)
    # @return [Array<String>] the files written
    def write(dir, header)
      FileUtils.mkdir_p(dir)
      csv = File.join(dir, "results.csv")
      CSV.open(csv, "w") do |out|
        out << Record.members
        @records.each { |r| out << r.to_a }
      end
      md = File.join(dir, "results.md")
      File.write(md, "#{header}\n\n#{@tables.map { |t| self.class.markdown(t) }.join("\n\n")}\n")
      [csv, md]
    end
  end

  # Connections and server-side counters of the throwaway database.
  class Database
    # @return [String] the PostgreSQL URL every variant connects to
    attr_reader :url

    # @param url [String] PostgreSQL URL
    def initialize(url)
      @url = url
      @admin = connect
      @statements = enable_pg_stat_statements
    end

    # @param url [String] another URL (e.g. through the counting proxy)
    # @return [PG::Connection] a new connection, notices silenced
    def connect(url = @url)
      PG.connect(url).tap { |c| c.exec("SET client_min_messages = warning") }
    end

    # @param host [String]
    # @param port [Integer]
    # @return [String] this database's URL with another host and port
    def url_via(host, port)
      uri = URI.parse(@url)
      uri.host = host
      uri.port = port
      uri.to_s
    end

    # @return [Boolean] whether pg_stat_statements counts statements here (it needs
    #   `shared_preload_libraries`, which bin/bench sets on the PostgreSQL it starts)
    def statements?
      @statements
    end

    # Server-side counters, read without disturbing them: statements executed
    # (pg_stat_statements, all but this reader's own), transaction ids assigned (one
    # per transaction that wrote, i.e. per durable commit) and WAL bytes inserted.
    # @return [Hash{Symbol => Integer, nil}] :statements (nil without
    #   pg_stat_statements), :writes, :wal_bytes
    def counters
      row = @admin.exec(<<~SQL).first
        SELECT /* bench-counter */ pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
               pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint AS wal
      SQL
      { statements: statement_calls, writes: row["next_xid"].to_i, wal_bytes: row["wal"].to_i }
    end

    # CPU time of the whole PostgreSQL server on this machine so far: the postmaster's own,
    # its live children's (backends, WAL writer, checkpointer, ...) and the exited
    # children it reaped (a backend's time moves to the postmaster's when its session
    # ends). Read from /proc through the data directory's postmaster.pid.
    # @return [Float, nil] seconds of user + system CPU, nil when the server is not a
    #   local process this user can read (another machine, no /proc, no privilege)
    def server_cpu_seconds
      postmaster = postmaster_pid
      return nil unless postmaster

      ticks = Dir.glob("/proc/[0-9]*/stat").sum do |path|
        fields = proc_stat(path)
        fields && fields[1].to_i == postmaster ? fields[11].to_i + fields[12].to_i : 0
      end
      own = proc_stat("/proc/#{postmaster}/stat") or return nil
      (ticks + own[11..14].sum(&:to_i)).to_f / Etc.sysconf(Etc::SC_CLK_TCK)
    end

    # @return [String] the server's clock now (for {#wait_for_sessions})
    def server_now
      exec("SELECT /* bench-counter */ clock_timestamp()::text").getvalue(0, 0)
    end

    # Waits (at most 10 s) until every session opened since `since` has ended, so their
    # CPU time has moved to the postmaster's ({#server_cpu_seconds} counts it once). The
    # benchmark's own sessions, opened before, are not waited for.
    # @param since [String] a server time ({#server_now}) taken before the run started
    # @return [Boolean] false when some session was still open after 10 s
    def wait_for_sessions(since)
      100.times do
        open = exec("SELECT /* bench-counter */ count(*) FROM pg_stat_activity WHERE backend_type = " \
                    "'client backend' AND backend_start >= $1::timestamptz", [since]).getvalue(0, 0).to_i
        return true if open.zero?

        sleep 0.1
      end
      false
    end

    # @param sql [String]
    # @param params [Array]
    # @return [PG::Result] the statement run on the admin connection
    def exec(sql, params = [])
      @admin.exec_params(sql, params)
    end

    # @return [String] server version and the settings that shape the figures
    def describe
      settings = %w[server_version fsync synchronous_commit shared_buffers max_wal_size].map do |name|
        "#{name}=#{@admin.exec("SHOW #{name}").getvalue(0, 0)}"
      end
      settings.join(" ")
    end

    private

    # @return [Integer, nil] the postmaster's process id (first line of postmaster.pid)
    def postmaster_pid
      return @postmaster_pid if defined?(@postmaster_pid)

      dir = @admin.exec("SELECT /* bench-counter */ current_setting('data_directory')").getvalue(0, 0)
      @postmaster_pid = Integer(File.foreach(File.join(dir, "postmaster.pid")).first)
    rescue PG::Error, SystemCallError, ArgumentError
      @postmaster_pid = nil
    end

    # @return [Array<String>, nil] a /proc/PID/stat's fields after the command name (state
    #   first: [1] is the parent's pid, [11]/[12] utime/stime, [13]/[14] the reaped
    #   children's), nil when the process has gone
    def proc_stat(path)
      File.read(path).split(") ", 2).last.split
    rescue SystemCallError
      nil
    end

    def statement_calls
      return nil unless @statements

      @admin.exec("SELECT /* bench-counter */ coalesce(sum(calls), 0)::bigint AS n FROM pg_stat_statements " \
                  "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) " \
                  "AND query NOT LIKE '%bench-counter%'").getvalue(0, 0).to_i
    end

    def enable_pg_stat_statements
      loaded = @admin.exec("SHOW shared_preload_libraries").getvalue(0, 0).include?("pg_stat_statements")
      return false unless loaded

      @admin.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
      true
    rescue PG::Error
      false
    end
  end
end
