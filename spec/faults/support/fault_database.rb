# frozen_string_literal: true

require "fileutils"
require "socket"
require "pg"

# A PostgreSQL cluster of the fault suite's own (initdb on a free port under tmp/),
# so that restarting it or killing its backends never touches the suite's database.
class FaultDatabase
  ROOT = File.expand_path("../../..", __dir__)

  # @return [Integer] the port it listens on (127.0.0.1)
  attr_reader :port

  def initialize
    @dir = File.join(ROOT, "tmp", "faults-pg-#{Process.pid}")
    @bin = ENV["PG_BIN"] || Dir["/usr/lib/postgresql/*/bin"].max_by { |d| d[/\d+/].to_i }
    @port = free_port
  end

  # @return [String] a URL of the database, direct or through `port`
  def url(port = @port)
    "postgres://postgres@127.0.0.1:#{port}/postgres"
  end

  # @return [self]
  def start
    FileUtils.rm_rf(@dir)
    FileUtils.mkdir_p(@dir)
    if Process.uid.zero?
      FileUtils.chown("postgres", "postgres", @dir)
      File.chmod(0o700, @dir)
    end
    as_postgres("#{@bin}/initdb -D #{@dir}/data -U postgres -A trust --no-sync >#{@dir}/initdb.log 2>&1")
    pg_ctl("start")
    self
  end

  # A restart as an operator's takes: `pg_ctl stop -m fast` (every connection is
  # closed), `down` seconds with the server down (connections refused), then start.
  # @return [Float] seconds the server was unavailable
  def restart(down: 1)
    timed do
      pg_ctl("stop", "-m fast")
      sleep down
      pg_ctl("start")
    end
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

  def stop
    pg_ctl("stop", "-m immediate")
    FileUtils.rm_rf(@dir)
  end

  private

  def pg_ctl(command, extra = "")
    as_postgres("#{@bin}/pg_ctl -D #{@dir}/data -l #{@dir}/pg.log -w -t 60 #{extra} " \
                "-o '-p #{@port} -k #{@dir} -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off' " \
                "#{command} >/dev/null")
  end

  def as_postgres(command)
    full = Process.uid.zero? ? ["su", "postgres", "-s", "/bin/sh", "-c", command] : ["sh", "-c", command]
    system(*full) || raise("failed: #{command} (see #{@dir})")
  end

  def timed
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    yield
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  end

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end
end
