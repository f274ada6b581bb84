# frozen_string_literal: true

require "timeout"

# Real worker processes for crash and race tests: fork, pipe, SIGKILL.
module Processes
  # Forks a child that runs the block with a pipe to the parent; the child leaves
  # with exit! (no at_exit hooks of the parent's RSpec run).
  # @return [Array(Integer, IO)] the child's pid and the parent's reading end
  def fork_worker
    reader, writer = IO.pipe
    pid = fork do
      Processes.children.clear
      # A child never uses its parent's ActiveRecord sockets.
      ActiveRecord::Base.establish_connection(SpecServices.active_record_url) if defined?(ActiveRecord::Base)
      reader.close
      writer.sync = true
      begin
        yield writer
        # exit! skips at_exit, where the gem writes the repeat bookkeeping still queued
        # (a normal exit): do it here, so counts checked after the child are complete.
        IdempotentJob.settle_repeats
        exit!(0)
      rescue Exception => e # rubocop:disable Lint/RescueException -- report everything to the parent
        writer.puts("error #{e.class}: #{e.message}")
        exit!(1)
      end
    end
    writer.close
    Processes.children << pid
    [pid, reader]
  end

  # Children of the current example, SIGKILLed after it so none outlives a failure.
  def self.children
    @children ||= []
  end

  def self.reap!
    children.each do |pid|
      Process.kill(:KILL, pid)
      Process.wait(pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
    children.clear
  end

  # @return [String] the next line the child wrote
  def read_line(reader, timeout: 15)
    Timeout.timeout(timeout) { reader.gets&.chomp } || raise("the child closed its pipe without a word")
  end

  def kill9(pid)
    Process.kill(:KILL, pid)
    Process.wait(pid)
  end

  # @return [Process::Status]
  def wait_child(pid, timeout: 30)
    Timeout.timeout(timeout) { Process.wait2(pid).last }
  end
end

RSpec.configure do |config|
  config.include Processes
  config.after { Processes.reap! }
end
