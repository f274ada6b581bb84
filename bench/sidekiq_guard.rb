# frozen_string_literal: true

require "connection_pool"
require "pg"
require "securerandom"

module IdempotentJobBench
  # The hand-written guard of table 5: what a team writes without the gem, as a Sidekiq
  # server middleware with the pg gem. One narrow table; a delivery inserts its claim
  # (`INSERT … ON CONFLICT DO NOTHING RETURNING`), runs the body, and marks the claim
  # completed (`UPDATE`); both statements are named prepared statements on durable
  # commits. A delivery whose insert met a record reads it: completed → not run; a live
  # claim → re-scheduled (a copy pushed to Sidekiq's scheduled set after 1 s, as the gem
  # defers it); an expired claim → taken over (fenced by the token it read). A body
  # that raises deletes its claim, so Sidekiq's retry runs it again. No heartbeat
  # (leases are long), no duplicate count, payload, repeat history or mismatch check.
  class SidekiqGuard
    # The guard's table (created by {.create_table}).
    TABLE = "bench_guard_jobs"
    # The table a team would create: the key, the claim's token and lease, the completion.
    TABLE_SQL = <<~SQL.freeze
      CREATE TABLE IF NOT EXISTS #{TABLE} (
          job_type      text        NOT NULL,
          operation_key text        NOT NULL,
          token         uuid        NOT NULL,
          locked_until  timestamptz NOT NULL,
          completed_at  timestamptz,
          PRIMARY KEY (job_type, operation_key))
    SQL
    # Each statement, prepared once per connection.
    STATEMENTS = {
      "guard_claim" => "INSERT INTO #{TABLE} (job_type, operation_key, token, locked_until) " \
                       "VALUES ($1, $2, $3, now() + make_interval(secs => $4)) " \
                       "ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING token",
      "guard_read" => "SELECT completed_at IS NOT NULL AS completed, token, " \
                      "extract(epoch FROM locked_until - now())::float8 AS remaining " \
                      "FROM #{TABLE} WHERE job_type = $1 AND operation_key = $2",
      "guard_takeover" => "UPDATE #{TABLE} SET token = $3, locked_until = now() + make_interval(secs => $4) " \
                          "WHERE job_type = $1 AND operation_key = $2 AND token = $5 AND completed_at IS NULL",
      "guard_complete" => "UPDATE #{TABLE} SET completed_at = now() " \
                          "WHERE job_type = $1 AND operation_key = $2 AND token = $3",
      "guard_release" => "DELETE FROM #{TABLE} WHERE job_type = $1 AND operation_key = $2 AND token = $3"
    }.freeze
    # Lease of a claim, in seconds (the gem's default).
    LEASE = 300.0
    # Seconds before a delivery that met a live claim comes back (the gem's first deferral).
    DEFER = 1.0

    # Creates the table (idempotent).
    # @param conn [PG::Connection]
    # @return [void]
    def self.create_table(conn)
      conn.exec(TABLE_SQL)
    end

    class << self
      # @return [ConnectionPool] the guard's connections (set by {.setup})
      attr_reader :pool
      # @return [#call] called once per re-scheduled delivery
      attr_reader :deferred

      # Opens the guard's connections, each with its statements prepared (Sidekiq
      # builds a middleware object per job: the pool is the process's).
      # @param url [String] PostgreSQL URL
      # @param size [Integer] pooled connections (Sidekiq's concurrency)
      # @param deferred [#call] called once per re-scheduled delivery
      # @return [void]
      def setup(url:, size:, deferred:)
        @deferred = deferred
        @pool = ConnectionPool.new(size:, timeout: 30) do
          PG.connect(url).tap { |conn| STATEMENTS.each { |name, sql| conn.prepare(name, sql) } }
        end
      end
    end

    def initialize
      @pool = self.class.pool
    end

    # @param _job [Object]
    # @param job_hash [Hash] the payload; its first argument is the operation key
    # @param _queue [String]
    # @yield the job body
    # @return [Object, nil] the body's value, nil when it was not run
    # @raise [Exception] what the body raised (its claim deleted first)
    def call(_job, job_hash, _queue)
      type = job_hash["class"]
      key = job_hash["args"].first.to_s
      token = claim(type, key, job_hash)
      return nil unless token

      begin
        result = yield
      rescue Exception # rubocop:disable Lint/RescueException -- re-raised; the claim must not stay held
        @pool.with { |conn| conn.exec_prepared("guard_release", [type, key, token]) }
        raise
      end
      @pool.with { |conn| conn.exec_prepared("guard_complete", [type, key, token]) }
      result
    end

    private

    # @return [String, nil] the token when this delivery runs
    def claim(type, key, job_hash)
      token = SecureRandom.uuid
      row = nil
      won = @pool.with do |conn|
        # A record released between the insert and the read: insert again.
        loop do
          break true if conn.exec_prepared("guard_claim", [type, key, token, LEASE]).ntuples == 1

          row = conn.exec_prepared("guard_read", [type, key]).first
          break false if row
        end
      end
      return token if won
      return nil if row["completed"] == "t"
      return takeover(type, key, token, row["token"]) if row["remaining"].to_f <= 0

      defer(job_hash)
      nil
    end

    def takeover(type, key, token, old)
      changed = @pool.with { |conn| conn.exec_prepared("guard_takeover", [type, key, token, LEASE, old]).cmd_tuples }
      changed == 1 ? token : nil
    end

    def defer(job_hash)
      ::Sidekiq::Client.push(job_hash.merge("at" => Time.now.to_f + DEFER))
      self.class.deferred.call
    end
  end
end
