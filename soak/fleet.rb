# frozen_string_literal: true

require "json"

module Soak
  # The soak's `sidekiq` worker processes: N slots, each running one process at a time.
  # A slot's process gets a new worker id ("w<slot>-<incarnation>") at each start, so a
  # kill is never confused with a later process (pids are reused).
  class Fleet
    # One worker process.
    Worker = Struct.new(:slot, :incarnation, :pid, :log, :started_at, keyword_init: true) do
      # @return [String] "w<slot>-<incarnation>"
      def id
        "w#{slot}-#{incarnation}"
      end
    end

    # One SIGKILL: the worker (id and slot), its pid, when it landed (epoch seconds), and
    # the references of the deliveries it had in hand (moved back to the queue).
    Kill = Struct.new(:worker, :slot, :pid, :at, :requeued, keyword_init: true)

    # Seconds a worker may take to start fetching.
    BOOT_TIMEOUT = 60
    # Seconds a worker may take to stop after TERM before it is SIGKILLed.
    STOP_TIMEOUT = 20

    # @return [Array<Kill>]
    attr_reader :kills
    # @return [Array<String>] every worker's log file
    attr_reader :logs
    # @return [Array<String>] workers that exited without being killed, with their status
    attr_reader :deaths

    # @param size [Integer] worker processes
    # @param threads [Integer] Sidekiq concurrency of each
    # @param env [Hash{String => String}] environment of the workers
    # @param dir [String] where logs and the pid file go
    def initialize(size:, threads:, env:, dir:)
      @size = size
      @threads = threads
      @env = env
      @dir = dir
      @workers = {}
      @incarnations = Hash.new(0)
      @kills = []
      @logs = []
      @deaths = []
      @lock = Mutex.new
    end

    # Starts every slot and waits until each is fetching.
    # @return [void]
    # @raise [RuntimeError] when one does not start within {BOOT_TIMEOUT}
    def start_all
      (1..@size).each { |slot| start(slot) }
      wait_ready
    end

    # Starts a slot's next process (in the background).
    # @param slot [Integer]
    # @return [Worker]
    def start(slot)
      @lock.synchronize do
        worker = Worker.new(slot:, incarnation: @incarnations[slot] += 1, started_at: Time.now.to_f)
        worker.log = File.join(@dir, "#{worker.id}.log")
        worker.pid = Process.spawn(@env.merge("SOAK_WORKER_ID" => worker.id), "sidekiq", "-r", "./soak/boot.rb",
                                   "-q", QUEUE, "-c", @threads.to_s, "-t", "5",
                                   out: worker.log, err: worker.log, pgroup: true)
        @logs << worker.log
        @workers[slot] = worker
        write_pids
        worker
      end
    end

    # Waits until every running worker is fetching (and restarts none).
    # @return [void]
    # @raise [RuntimeError] after {BOOT_TIMEOUT} seconds
    def wait_ready
      deadline = Soak.monotonic + BOOT_TIMEOUT
      until running.all? { |worker| Journal.ready?(worker.id) }
        reap
        raise "workers did not start within #{BOOT_TIMEOUT} s (logs: #{@dir})" if Soak.monotonic > deadline

        sleep 0.2
      end
    end

    # @return [Array<Worker>] the running workers
    def running
      @lock.synchronize { @workers.values }
    end

    # @return [Array<Integer>] slots without a running worker
    def empty_slots
      @lock.synchronize { (1..@size).reject { |slot| @workers.key?(slot) } }
    end

    # SIGKILLs one running, fetching worker chosen at random, waits for it to die, and
    # moves the deliveries it had in hand back to the queue.
    # @param random [Random]
    # @return [Kill, nil] nil when no worker is fetching
    def kill_random(random)
      candidates = running.select { |worker| Journal.ready?(worker.id) }
      return nil if candidates.empty?

      kill(candidates[random.rand(candidates.size)])
    end

    # Moves back to the queue whatever reached a killed worker's in-hand list after its
    # kill was handled: a fetch Redis had blocked for the worker can still be served in the
    # instant before Redis notices the closed connection. Each job found is added to its
    # kill's requeued deliveries.
    # @param within [Numeric, nil] only workers killed within this many seconds; nil for all
    # @return [Integer] jobs moved back
    def sweep_killed(within: nil)
      recent = @lock.synchronize { @kills.select { |kill| within.nil? || kill.at >= Time.now.to_f - within } }
      recent.sum do |kill|
        found = recover(kill.worker)
        @lock.synchronize { kill.requeued.concat(found) }
        found.size
      end
    end

    # Starts the slots that have no worker and waits until they fetch.
    # @return [void]
    def fill
      empty_slots.each { |slot| start(slot) }
      wait_ready
    end

    # Stops every worker: TERM, then SIGKILL after {STOP_TIMEOUT} seconds.
    # @return [void]
    def stop_all
      workers = running
      workers.each { |worker| signal(:TERM, worker.pid) }
      deadline = Soak.monotonic + STOP_TIMEOUT
      workers.each do |worker|
        next if stopped_by(deadline, worker.pid)

        signal(:KILL, worker.pid)
        waitpid(worker.pid)
      end
      @lock.synchronize { @workers.clear }
      write_pids
    end

    # Notes workers that exited by themselves (they are not restarted: that is a failure).
    # @return [void]
    def reap
      # Under the lock: a worker being killed has left @workers before its signal, so its
      # process is reaped by #kill alone.
      @lock.synchronize do
        exited = @workers.values.filter_map do |worker|
          _, status = Process.wait2(worker.pid, Process::WNOHANG)
          [worker, status] if status
        end
        exited.each do |worker, status|
          @workers.delete(worker.slot)
          @deaths << "#{worker.id} (pid #{worker.pid}) exited by itself: #{status}; log #{worker.log}"
        end
      end
    end

    private

    def kill(worker)
      # Out of @workers first, so #reap never waits for this process.
      return nil unless @lock.synchronize { @workers[worker.slot].equal?(worker) && @workers.delete(worker.slot) }

      Process.kill(:KILL, worker.pid)
      at = Time.now.to_f
      waitpid(worker.pid)
      Kill.new(worker: worker.id, slot: worker.slot, pid: worker.pid, at:, requeued: recover(worker.id))
          .tap { |kill| @lock.synchronize { @kills << kill } }
    end

    # @return [Array<String>] references of the deliveries moved back to the queue
    def recover(worker_id)
      ReliableFetch.recover(worker_id).map do |job|
        payload = JSON.parse(job)
        Soak.reference(payload["class"], payload["args"].first)
      end
    end

    def signal(name, pid)
      Process.kill(name, pid)
    rescue Errno::ESRCH
      nil
    end

    # @return [Boolean] whether the process exited (and was reaped) before the deadline
    def stopped_by(deadline, pid)
      loop do
        return true if waitpid(pid, Process::WNOHANG)
        return false if Soak.monotonic > deadline

        sleep 0.1
      end
    end

    # @return [Integer, nil] the pid once reaped (nil while it runs, with WNOHANG), or
    #   -1 when it was reaped before
    def waitpid(pid, flags = 0)
      Process.wait(pid, flags)
    rescue Errno::ECHILD
      -1
    end

    # For bin/soak's cleanup, should the driver itself die.
    def write_pids
      File.write(File.join(@dir, "workers.pids"), @workers.values.map { |w| "#{w.pid}\n" }.join)
    end
  end
end
