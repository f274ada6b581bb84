# frozen_string_literal: true

require "fileutils"
require "open3"
require "shellwords"
require "socket"
require "tmpdir"

module IdempotentJob
  module Testing
    # A throwaway PostgreSQL server for a test suite that has no DATABASE_URL: a fresh
    # cluster in a temporary directory, listening on 127.0.0.1 only, trusted local
    # logins, stopped and deleted when the process exits (or on {#stop}).
    #
    #   db = IdempotentJob::Testing::Database.start
    #   db.url # => "postgres://postgres@127.0.0.1:41523/idempotent_job_test"
    #
    # Needs PostgreSQL's server programs (`initdb`, `pg_ctl`): found through `pg_config
    # --bindir`, `/usr/lib/postgresql/*/bin` (Debian) or PATH. Run as root, the server
    # runs as the `postgres` user, which PostgreSQL requires.
    class Database
      # Database created in the cluster.
      DATABASE = "idempotent_job_test"
      # Seconds to wait for the server to accept connections.
      START_TIMEOUT = 60

      # Ports picked from: below Linux's ephemeral range (32768-60999), where the local
      # end of an outgoing connection made between this pick and the server's bind
      # could take the port.
      FREE_PORTS = (20_000..32_000)

      # @return [String] a libpq URL for the database
      attr_reader :url
      # @return [Integer] the TCP port on 127.0.0.1
      attr_reader :port
      # @return [String] the cluster's directory (deleted by {#stop})
      attr_reader :dir

      # Creates and starts a cluster.
      # @param port [Integer, nil] TCP port; nil picks a free one
      # @param bin_dir [String, nil] directory of initdb/pg_ctl; nil searches
      # @param keep [Boolean] leave the cluster running at exit (for debugging)
      # @return [Database] the running server
      # @raise [ConfigurationError] when PostgreSQL's programs are not found or the
      #   server does not start (with the command's output)
      def self.start(port: nil, bin_dir: nil, keep: false)
        new(port:, bin_dir:).tap do |db|
          db.start
          at_exit { db.stop } unless keep
        end
      end

      # @param port [Integer, nil] TCP port; nil picks a free one
      # @param bin_dir [String, nil] directory of initdb/pg_ctl; nil searches
      def initialize(port: nil, bin_dir: nil)
        @bin_dir = bin_dir || self.class.find_bin_dir
        @port = port || free_port
        @owner_pid = Process.pid
        @url = "postgres://postgres@127.0.0.1:#{@port}/#{DATABASE}"
      end

      # Runs initdb, starts the server and creates {DATABASE}.
      # @return [void]
      # @raise [ConfigurationError] when a step fails (its output is in the message)
      def start
        @dir = Dir.mktmpdir("idempotent_job-pg-")
        FileUtils.chown("postgres", "postgres", @dir) if root?
        run!("initdb", "-D #{data.shellescape} -U postgres -A trust --no-sync")
        start_server
        run!("createdb", "-h 127.0.0.1 -p #{@port} -U postgres #{DATABASE}")
      end

      # Stops the server (immediate shutdown) and deletes its directory. Does nothing in
      # a forked child or when already stopped.
      # @return [void]
      def stop
        return if @dir.nil? || Process.pid != @owner_pid

        stop_server("immediate", check: false)
        FileUtils.rm_rf(@dir)
        @dir = nil
      end

      # @return [String] the directory holding initdb and pg_ctl
      # @raise [ConfigurationError] when none is found
      def self.find_bin_dir
        candidates = []
        pg_config = `pg_config --bindir 2>/dev/null`.strip
        candidates << pg_config unless pg_config.empty?
        candidates.concat(Dir["/usr/lib/postgresql/*/bin"].sort_by { |d| d[%r{/(\d+)/bin}, 1].to_i }.reverse)
        candidates.concat(ENV.fetch("PATH", "").split(File::PATH_SEPARATOR))
        found = candidates.find { |d| File.executable?(File.join(d, "initdb")) }
        return found if found

        raise ConfigurationError, "IdempotentJob::Testing::Database: PostgreSQL's initdb was not found " \
                                  "(looked in pg_config --bindir, /usr/lib/postgresql/*/bin and PATH); " \
                                  "install the PostgreSQL server or set DATABASE_URL"
      end

      private

      # Starts the (initialised) cluster's server and waits until it accepts connections.
      def start_server
        options = "-p #{@port} -k #{@dir.shellescape} -c listen_addresses=127.0.0.1 -c fsync=off " \
                  "-c max_connections=200"
        run!("pg_ctl", "-D #{data.shellescape} -l #{File.join(@dir, "server.log").shellescape} -w " \
                       "-t #{START_TIMEOUT} -o #{options.shellescape} start")
      end

      # Stops the server with pg_ctl's shutdown `mode` ("fast", "immediate") and waits
      # until it is down; `check: false` ignores a failure (already stopped).
      def stop_server(mode, check: true)
        arguments = "-D #{data.shellescape} -m #{mode} -w stop"
        check ? run!("pg_ctl", arguments) : run("pg_ctl", arguments)
      end

      def data
        File.join(@dir, "data")
      end

      def root?
        Process.uid.zero?
      end

      # A port of {FREE_PORTS} nothing listens on at the moment of the pick.
      def free_port
        100.times do
          port = rand(FREE_PORTS)
          return TCPServer.new("127.0.0.1", port).then { |server| server.close || port }
        rescue Errno::EADDRINUSE
          next
        end
        raise ConfigurationError, "no free TCP port on 127.0.0.1 in #{FREE_PORTS} after 100 tries"
      end

      def command(program, arguments)
        line = "#{File.join(@bin_dir, program).shellescape} #{arguments}"
        root? ? ["su", "postgres", "-s", "/bin/sh", "-c", line] : ["/bin/sh", "-c", line]
      end

      def run(program, arguments)
        Open3.capture2e(*command(program, arguments))
      end

      def run!(program, arguments)
        output, status = run(program, arguments)
        return if status.success?

        raise ConfigurationError, "IdempotentJob::Testing::Database: #{program} failed " \
                                  "(#{status}):\n#{output}"
      end
    end
  end
end
