# frozen_string_literal: true

require "fileutils"
require "timeout"

# Real worker processes running the ActiveJob spec jobs: a `sidekiq` process on
# ActiveJob's :sidekiq adapter, or Delayed Job workers on the :delayed_job adapter.
# A driver starts and kills them, delivers copies of a job message, and waits until
# its queue is drained. Workers are SIGKILLed after each example (Processes.reap!).
module ActiveJobWorkers
  ROOT = File.expand_path("../..", __dir__)

  # What both drivers share: spawning, readiness, draining, logs.
  class Driver
    # @return [String] the log of every worker of the current example
    attr_reader :log

    def initialize(name)
      @name = name
      @log = File.join(ROOT, "tmp", "spec-aj-#{name}.log")
      FileUtils.mkdir_p(File.dirname(@log))
      File.write(@log, "")
    end

    # A job message delivered once more: the same job (same job_id) enqueued again
    # through the adapter, as an at-least-once queue redelivers it.
    def deliver(job)
      ActiveJob::Base.queue_adapter.enqueue(job)
    end

    # Copies delivered at the same moment: pushed together, the workers take them at once.
    def deliver_at_once(job, copies)
      copies.times { deliver(job) }
    end

    # A worker started to die: it performs the job and is SIGKILLed when it reaches
    # `point` (SPEC_STOP_AT); the workers started after it run through.
    # @return [Hash] the environment for the workers that follow
    def crash_at(point, job)
      marker = File.join(ROOT, "tmp", "spec-aj-stop-#{Process.pid}-#{rand(1 << 30)}")
      env = { "SPEC_STOP_AT" => point.to_s, "SPEC_MARKER" => marker }
      victim = start(env)
      deliver(job)
      Timeout.timeout(30) { sleep 0.05 until File.exist?(marker) }
      kill(victim)
      env
    end

    # Kills a worker with SIGKILL and reaps it.
    def kill(pid)
      Process.kill(:KILL, pid)
      Process.wait(pid)
    end

    # Stops a worker gracefully (TERM), waiting for it to finish its current jobs.
    def stop(pid)
      Process.kill(:TERM, pid)
      Timeout.timeout(30) { Process.wait(pid) }
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end

    # Waits until the queue holds nothing: no job waiting, scheduled, retried or running,
    # seen so on three polls in a row (a job a worker has just fetched is in neither
    # place for an instant).
    # @return [Boolean] whether it drained within `timeout` seconds
    def wait_until_drained(timeout: 40)
      deadline = now + timeout
      quiet = 0
      until quiet >= 3 || now > deadline
        quiet = drained? ? quiet + 1 : 0
        sleep 0.2
      end
      quiet >= 3
    end

    private

    def spawn_worker(env, *command)
      env = { "DATABASE_URL" => ENV.fetch("DATABASE_URL"), "REDIS_URL" => ENV.fetch("REDIS_URL") }.merge(env)
      pid = Process.spawn(env, *command, chdir: ROOT, out: [@log, "a"], err: [@log, "a"])
      Processes.children << pid
      pid
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end

  # ActiveJob on Sidekiq's adapter, worked by a real `sidekiq` process.
  class Sidekiq < Driver
    def initialize
      super("sidekiq")
      require "sidekiq/api"
      require "active_job/queue_adapters/sidekiq_adapter"
    end

    # @return [Symbol] the ActiveJob adapter the spec process enqueues with
    def adapter
      :sidekiq
    end

    # Wraps an example: Sidekiq's testing mode off (real pushes), Redis emptied.
    def around
      ::Sidekiq::Testing.disable! do
        ::Sidekiq.redis(&:flushdb)
        yield
      end
    end

    # Starts one `sidekiq` process (its concurrent copies are threads).
    # @param shutdown_timeout [Integer] seconds Sidekiq waits on TERM before it raises
    #   Sidekiq::Shutdown in the jobs still running (its `-t`)
    # @param concurrency [Integer] worker threads (its `-c`)
    # @return [Integer] pid
    def start(env = {}, shutdown_timeout: 8, concurrency: 5)
      pid = spawn_worker(env, "sidekiq", "-r", File.join(ROOT, "spec/support/active_job_sidekiq_boot.rb"),
                         "-c", concurrency.to_s, "-q", "default", "-t", shutdown_timeout.to_s)
      wait_ready(pid)
      pid
    end

    # Nothing queued, scheduled or retried, and no job in a live worker's hands (counted
    # by the boot file's SpecInflight middleware, at once; Sidekiq's busy list lags).
    def drained?
      ::Sidekiq::Queue.new("default").size.zero? && ::Sidekiq::ScheduledSet.new.size.zero? &&
        ::Sidekiq::RetrySet.new.size.zero? && in_hand.zero?
    end

    private

    def in_hand
      ::Sidekiq.redis do |redis|
        redis.keys("spec:active_job:inflight:*").sum do |key|
          alive?(Integer(key.split(":").last)) ? redis.get(key).to_i : 0
        end
      end
    end

    def alive?(pid)
      Process.kill(0, pid)
      true
    rescue Errno::ESRCH
      false
    end

    # Sidekiq registers its process in Redis once it is up.
    def wait_ready(pid)
      Timeout.timeout(30) { sleep 0.1 until ::Sidekiq::ProcessSet.new.any? { |p| p["pid"] == pid } }
    end
  end

  # ActiveJob on Delayed Job, worked by real DJ worker processes on the same PostgreSQL.
  class DelayedJob < Driver
    def initialize
      super("delayed-job")
      require_relative "delayed_job_setup"
      DelayedJobSetup.create_table!
    end

    def adapter
      :delayed_job
    end

    def around
      DelayedJobSetup.clear!
      yield
    end

    # Starts one worker process (concurrent copies need two: each works one job at a time).
    # @return [Integer] pid
    def start(env = {})
      before = File.read(log).scan(/^ready (\d+)$/).size
      pid = spawn_worker(env, RbConfig.ruby, File.join(ROOT, "spec/support/delayed_job_worker.rb"))
      Timeout.timeout(30) { sleep 0.1 until File.read(log).scan(/^ready (\d+)$/).size > before }
      pid
    end

    def drained?
      Delayed::Job.count.zero?
    end
  end

  # Counts jobs enqueued and not yet performed in this process (the async pool).
  module PendingJobs
    @count = 0
    @lock = Mutex.new

    class << self
      attr_reader :count

      def change(delta)
        @lock.synchronize { @count += delta }
      end

      def reset!
        @lock.synchronize { @count = 0 }
      end
    end

    ActiveSupport::Notifications.subscribe(/\A(enqueue|enqueue_at)\.active_job\z/) { change(1) }
    ActiveSupport::Notifications.subscribe("perform.active_job") { change(-1) }
  end

  # ActiveJob's in-process adapters, :inline (a delivery runs in the caller; a copy
  # that meets a live claim waits there) and :async (a thread pool; such a copy is
  # re-enqueued with retry_job). There are no workers to start: the spec process is
  # the worker; a worker that dies is a forked child SIGKILLed inside perform.
  class InProcess
    include Processes
    include RSpec::Matchers

    attr_reader :adapter

    def initialize(adapter)
      @adapter = adapter
    end

    def log
      "(in process)"
    end

    # Each example gets a fresh adapter (with_adapter) whose pool is shut down at its
    # end, waiting for the running jobs: nothing of one example (a lingering body, a
    # scheduled re-enqueue) runs in the next one or moves its PendingJobs count.
    def around
      PendingJobs.reset!
      yield
    ensure
      adapter = ActiveJob::Base.queue_adapter
      adapter.shutdown(wait: true) if adapter.respond_to?(:shutdown)
    end

    def start(_env = {}) = nil

    def stop(_pid) = nil

    # The same message (same job_id) delivered once more, straight to the adapter
    # (no enqueue event: counted here).
    def deliver(job)
      PendingJobs.change(1)
      ActiveJob::Base.queue_adapter.enqueue(job)
    end

    # Copies of one message (same job_id) delivered at the same moment, each from its own
    # thread. Each thread enqueues its own copy: ActiveJob's job instance is not
    # thread-safe (its lazy queue_name, evaluated by two serializers at once, raised
    # TypeError in CI).
    def deliver_at_once(job, copies)
      data = job.serialize
      Array.new(copies) { Thread.new { deliver(ActiveJob::Base.deserialize(data)) } }.each(&:join)
    end

    # A forked worker performs the job and is SIGKILLed when it reaches `point`.
    def crash_at(point, job)
      data = job.serialize
      pid, reader = fork_worker do |pipe|
        SpecHooks.on(point) do
          pipe.puts("at #{point}")
          sleep 60
        end
        ActiveJob::Base.execute(data)
      end
      expect(read_line(reader)).to eq("at #{point}")
      kill9(pid)
    end

    # Waits for the async pool (and its scheduled re-enqueues) to finish.
    def wait_until_drained(timeout: 20)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      sleep 0.05 until PendingJobs.count <= 0 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      PendingJobs.count <= 0
    end
  end

  # Runs the block with `name` as ActiveJob's adapter, then puts the previous one back.
  def with_adapter(name)
    previous = ActiveJob::Base.queue_adapter
    ActiveJob::Base.queue_adapter = name
    yield
  ensure
    ActiveJob::Base.queue_adapter = previous
  end
end

RSpec.configure { |config| config.include ActiveJobWorkers }
