# frozen_string_literal: true

require "pg"
require "idempotent_job/testing/database"

# A PostgreSQL cluster of the fault suite's own (the testing kit's throwaway server),
# so that restarting it or killing its backends never touches the suite's database.
class FaultDatabase < IdempotentJob::Testing::Database
  # @param port [Integer] where to reach it: its own port, or a proxy's in front of it
  # @return [String] a URL of the database, direct or through `port`
  def url(port = self.port)
    "postgres://postgres@127.0.0.1:#{port}/#{DATABASE}"
  end

  # A restart as an operator's takes: `pg_ctl stop -m fast` (every connection is
  # closed), `down` seconds with the server down (connections refused), then start.
  # @return [Float] seconds the server was unavailable
  def restart(down: 1)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    stop_server("fast")
    sleep down
    start_server
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  end

  # Terminates every backend whose application_name is `name`.
  # @return [Integer] backends terminated
  def terminate(name)
    with_connection do |c|
      c.exec_params("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                    [name]).getvalue(0, 0).to_i
    end
  end

  # @yieldparam connection [PG::Connection] a short-lived direct connection
  def with_connection
    connection = PG.connect(url)
    connection.exec("SET client_min_messages = warning")
    yield connection
  ensure
    connection&.close
  end
end
