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

    # Waits until the queue holds nothing: no job waiting, scheduled, retried or running.
    # @return [Boolean] whether it drained within `timeout` seconds
    def wait_until_drained(timeout: 40)
      deadline = now + timeout
      sleep 0.2 until drained? || now > deadline
      drained?
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

    def drained?
      ::Sidekiq::Queue.new("default").size.zero? && ::Sidekiq::ScheduledSet.new.size.zero? &&
        ::Sidekiq::RetrySet.new.size.zero? && ::Sidekiq::Workers.new.size.zero?
    end

    private

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

  # @return [String] a fresh marker path for SPEC_STOP_AT (see AjSpecBody)
  def stop_marker
    path = File.join(ROOT, "tmp", "spec-aj-stop-#{Process.pid}-#{rand(1 << 30)}")
    FileUtils.rm_f(path)
    path
  end

  # Waits until a worker reached its stop point.
  def wait_for_marker(path, timeout: 30)
    Timeout.timeout(timeout) { sleep 0.05 until File.exist?(path) }
  end
end

RSpec.configure { |config| config.include ActiveJobWorkers }
