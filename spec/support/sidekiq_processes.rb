# frozen_string_literal: true

require "sidekiq/api"

# Helpers for specs that run a real `sidekiq` process on the suite's Redis.
module SidekiqProcesses
  # Stops a `sidekiq` process started with Process.spawn (TERM, then waits up to 30 s).
  # @param pid [Integer]
  # @return [void]
  def stop_sidekiq(pid)
    Process.kill(:TERM, pid)
    Timeout.timeout(30) { Process.wait(pid) }
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  # @return [Boolean] nothing queued, scheduled, waiting for a retry or running
  def drained?
    Sidekiq::Queue.new("default").size.zero? && Sidekiq::ScheduledSet.new.size.zero? &&
      Sidekiq::RetrySet.new.size.zero? && Sidekiq::Workers.new.size.zero?
  end
end
