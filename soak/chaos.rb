# frozen_string_literal: true

module Soak
  # The soak's own PostgreSQL cluster, restarted once mid-run with `pg_ctl restart`
  # (fast shutdown: open transactions are rolled back and every connection is dropped).
  # As root, pg_ctl runs as the `postgres` user (PostgreSQL refuses root).
  class Postgres
    # @return [Array<Array(Float, Float)>] each restart's start and end, epoch seconds
    attr_reader :restarts

    # @param data_dir [String] the cluster's data directory
    # @param pg_bin [String] directory of pg_ctl
    # @param log [String] file for pg_ctl's output
    def initialize(data_dir:, pg_bin:, log:)
      @data_dir = File.expand_path(data_dir)
      @pg_bin = pg_bin
      @log = log
      # The restarted server logs where bin/services started it (a file the postgres user may write).
      @server_log = File.join(File.dirname(@data_dir), "pg.log")
      @restarts = []
    end

    # Restarts the cluster and waits until it accepts connections again.
    # @return [Float] seconds it took
    # @raise [RuntimeError] when pg_ctl fails
    def restart
      from = Time.now.to_f
      command = "#{@pg_bin}/pg_ctl -D '#{@data_dir}' -l '#{@server_log}' -m fast -w -t 60 restart"
      argv = Process.uid.zero? ? ["su", "postgres", "-s", "/bin/sh", "-c", command] : ["sh", "-c", command]
      system(*argv, out: [@log, "a"], err: [@log, "a"]) or
        raise "pg_ctl restart failed (see #{@log} and #{@server_log})"
      @restarts << [from, Time.now.to_f]
      @restarts.last.last - from
    end
  end

  # The faults of the run: SIGKILLs random workers at random moments (about every
  # `kill_every` seconds), starts each killed slot again after 0.2–2 s, and restarts
  # PostgreSQL once, at a random moment between 30 % and 70 % of the run.
  class Chaos
    # @param fleet [Fleet]
    # @param postgres [Postgres]
    # @param random [Random]
    # @param kill_every [Float] mean seconds between kills (0: no kills)
    # @param seconds [Float] length of the run
    # @yieldparam line [String] a progress line to print
    def initialize(fleet:, postgres:, random:, kill_every:, seconds:, &say)
      @fleet = fleet
      @postgres = postgres
      @random = random
      @kill_every = kill_every
      @seconds = seconds
      @say = say
      @stopped = false
      @restarts = {}
    end

    # Runs until {stop}; returns with every killed slot started again.
    # @param started_at [Float] the run's start, monotonic seconds
    # @return [void]
    def run(started_at)
      restart_at = started_at + (@seconds * (0.3 + (0.4 * @random.rand)))
      next_kill = next_kill_after(started_at)
      until @stopped
        now = Soak.monotonic
        if restart_at && now >= restart_at
          restart_at = nil
          restart_postgres(started_at)
        end
        next_kill = kill(now) if next_kill && now >= next_kill
        start_due(now)
        sweep(now)
        sleep 0.05
      end
      @restarts.each_key { |slot| @fleet.start(slot) }
    end

    # Makes {run} return.
    # @return [void]
    def stop
      @stopped = true
    end

    # @return [Array<Fleet::Kill>] the kills so far
    def kills
      @fleet.kills
    end

    # @return [Array<Array(Float, Float)>] PostgreSQL restarts so far, start and end in epoch seconds
    def restarts
      @postgres.restarts
    end

    private

    def next_kill_after(now)
      return nil unless @kill_every.positive?

      now + (@kill_every * (0.5 + @random.rand))
    end

    def kill(now)
      kill = @fleet.kill_random(@random)
      @restarts[kill.slot] = now + 0.2 + (1.8 * @random.rand) if kill
      next_kill_after(now)
    end

    # Once a second, late arrivals in the lists of workers killed in the last 10 s.
    def sweep(now)
      return if @swept_at && now - @swept_at < 1

      @swept_at = now
      @fleet.sweep_killed(within: 10)
    end

    def start_due(now)
      @restarts.select { |_, at| now >= at }.each_key do |slot|
        @restarts.delete(slot)
        @fleet.start(slot)
      end
    end

    def restart_postgres(started_at)
      @say.call(format("%<t>.0f s: restarting PostgreSQL (pg_ctl restart -m fast)", t: Soak.monotonic - started_at))
      took = @postgres.restart
      @say.call(format("%<t>.0f s: PostgreSQL is back after %<took>.1f s", t: Soak.monotonic - started_at, took:))
    end
  end
end
