# frozen_string_literal: true

# Run by the memory section in a fresh Ruby process: `ruby bench/memory_probe.rb gem|pg POOL`.
# Prints one JSON object: the process's resident set (VmRSS, kB) at each stage, and
# the resident size of the extension's own mapping. `gem` loads idempotent_job and
# starts its runtime and a pool of POOL connections; `pg` opens POOL connections
# with the pg gem instead, for comparison. Needs DATABASE_URL.
require "json"
require "logger"
require "digest/sha2"
require "securerandom"

# Measurements of this process's memory from /proc.
module Probe
  # @return [Integer] resident set size in kB
  def self.rss
    File.read("/proc/self/status")[/^VmRSS:\s+(\d+)/, 1].to_i
  end

  # @param pattern [Regexp] mapped file name
  # @return [Integer] kB resident of the mappings whose file matches
  def self.mapped(pattern)
    total = 0
    inside = false
    File.foreach("/proc/self/smaps") do |line|
      if line.match?(/\A\h+-\h+ /)
        inside = line.match?(pattern)
      elsif inside && line.start_with?("Rss:")
        total += line[/\d+/].to_i
      end
    end
    total
  end

  # @param key [String]
  # @return [Hash] the options of a delivery of a new operation (IdempotentJob.perform_once)
  def self.options
    { lease: 300.0, job_class: "MemoryProbe", queue: "default" }
  end
end

mode = ARGV.fetch(0)
pool = Integer(ARGV.fetch(1))
url = ENV.fetch("DATABASE_URL")
stages = [["ruby + json, logger, digest, securerandom", Probe.rss]]

if mode == "gem"
  $LOAD_PATH.unshift File.expand_path("../lib", __dir__)
  require "idempotent_job"
  stages << ["require \"idempotent_job\"", Probe.rss]
  IdempotentJob.configure(database_url: url, pool_size: pool, logger: Logger.new(File::NULL))
  stages << ["configure (nothing connects yet)", Probe.rss]
  IdempotentJob.perform_once("MemoryProbe", SecureRandom.hex(16), **Probe.options) { nil }
  stages << ["first claim: runtime + pool + 1 connection", Probe.rss]
  Array.new(pool) { IdempotentJob.store.transaction }.each(&:rollback)
  stages << ["#{pool} pooled connections open", Probe.rss]
  1000.times do
    key = SecureRandom.hex(16)
    outcome = IdempotentJob.perform_once("MemoryProbe", key, payload: [key], **Probe.options) { nil }
    raise "a new operation decided #{outcome.decision.inspect}" unless outcome.decision == :ran
  end
  stages << ["after 1000 deliveries (claim + completion)", Probe.rss]
  extension = Probe.mapped(/idempotent_job\.so/)
else
  require "pg"
  stages << ["require \"pg\"", Probe.rss]
  conns = Array.new(pool) { PG.connect(url) }
  conns.each { |c| c.exec("SELECT 1") }
  stages << ["#{pool} connections open", Probe.rss]
  1000.times { conns.first.exec_params("SELECT $1::text", [SecureRandom.hex(16)]) }
  stages << ["after 1000 statements", Probe.rss]
  extension = Probe.mapped(/pg_ext\.so|libpq/)
end

GC.start
stages << ["after GC.start", Probe.rss]
puts JSON.generate(stages:, extension_kb: extension, threads: Dir.children("/proc/self/task").size)
