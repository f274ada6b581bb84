# frozen_string_literal: true

require "pg"

# The observable effect of the spec jobs: one row per run of a job body, written
# through the pg gem (a real write, visible across threads and processes).
module Effects
  @connections = {}
  @lock = Mutex.new

  class << self
    # A connection for the current process and thread (a forked child never reuses
    # its parent's socket).
    def connection
      @lock.synchronize do
        @connections[[Process.pid, Thread.current.object_id]] ||= PG.connect(SpecServices.database_url).tap do |c|
          c.exec("SET client_min_messages = warning")
        end
      end
    end

    def create_table!
      connection.exec(<<~SQL)
        CREATE TABLE IF NOT EXISTS spec_effects (
          id bigserial PRIMARY KEY, job text NOT NULL, operation text NOT NULL,
          pid integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())
      SQL
    end

    # Empties the spec tables. A session left holding a lock on one of them (an earlier
    # example's open transaction) fails this within 20 s, naming that session, instead
    # of stalling the next example.
    def reset!
      tables = %w[spec_effects idempotent_job_records]
      tables << "spec_payments" if connection.exec("SELECT to_regclass('spec_payments')").getvalue(0, 0)
      connection.transaction do |c|
        c.exec("SET LOCAL lock_timeout = '20s'")
        c.exec("TRUNCATE #{tables.join(", ")}")
      end
    rescue PG::LockNotAvailable
      raise "the spec tables are locked by another session: #{lock_holders(tables).inspect}"
    end

    def lock_holders(tables)
      connection.exec_params(<<~SQL, ["{#{tables.join(",")}}"]).to_a
        SELECT a.pid, a.application_name, a.state, left(a.query, 200) AS query, l.mode, l.relation::regclass::text
          FROM pg_locks l JOIN pg_stat_activity a USING (pid)
         WHERE l.granted AND a.pid <> pg_backend_pid() AND l.relation::regclass::text = ANY ($1::text[])
      SQL
    end

    def record(job, operation)
      connection.exec_params("INSERT INTO spec_effects (job, operation, pid) VALUES ($1, $2, $3)",
                             [job, operation.to_s, Process.pid])
    end

    # @return [Integer] effect rows, optionally for one operation
    def count(operation = nil)
      sql = "SELECT count(*) FROM spec_effects"
      return connection.exec(sql).getvalue(0, 0).to_i if operation.nil?

      connection.exec_params("#{sql} WHERE operation = $1", [operation.to_s]).getvalue(0, 0).to_i
    end
  end
end

# Named points inside the spec jobs' bodies where a test can block, signal or raise.
module SpecHooks
  @hooks = {}

  class << self
    def reset!
      @hooks = {}
    end

    def on(point, &block)
      @hooks[point] = block
    end

    def call(point, *args)
      @hooks[point]&.call(*args)
    end
  end
end
