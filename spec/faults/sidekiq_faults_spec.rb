# frozen_string_literal: true

require "spec_helper"
require_relative "../support/sidekiq_processes"
require_relative "support/fault_database"
require_relative "support/fault_proxy"

# A real `sidekiq` process works through jobs while the database or the network
# fails under it: PostgreSQL restarted, the gem's backends killed, every connection
# reset, the network silently dropped (blackhole) and restored. Each scenario prints
# its figures and checks that every operation's body ran exactly once and its record
# ended completed.
RSpec.describe "Connection faults under a real Sidekiq process", :faults do
  include SidekiqProcesses

  let(:root) { File.expand_path("../..", __dir__) }
  let(:operations) { Integer(ENV.fetch("FAULT_OPERATIONS", "400")) }

  before(:all) do
    @db = FaultDatabase.start
    @proxy = FaultProxy.new(@db.port)
    SpecServices.configure_gem!(database_url: @db.url)
    IdempotentJob.migrate!
    SpecServices.configure_gem!
  end

  after(:all) do
    @proxy&.stop
    @db&.stop
  end

  let(:dir) { File.join(root, "tmp", "faults-#{Process.pid}-#{rand(1 << 30)}") }

  around do |example|
    FileUtils.mkdir_p(dir)
    @db.with_connection { |c| c.exec("TRUNCATE idempotent_job_records") }
    Sidekiq::Testing.disable! do
      Sidekiq.redis(&:flushdb)
      example.run
    end
  end

  def lines(name)
    path = File.join(dir, name)
    File.exist?(path) ? File.readlines(path, chomp: true) : []
  end

  def start_sidekiq(url, settings, work)
    env = { "REDIS_URL" => ENV.fetch("REDIS_URL"), "FAULT_DIR" => dir, "FAULT_GEM_URL" => url,
            "FAULT_WORK" => work.to_s,
            "FAULT_SETTINGS" => settings.map { |k, v| "#{k}=#{v}" }.join(",") }
    Process.spawn(env, "sidekiq", "-r", File.join(root, "spec/faults/support/boot.rb"), "-c", "5",
                  chdir: root, out: File.join(dir, "sidekiq.log"), err: File.join(dir, "sidekiq.log"), pgroup: true)
  end

  def wait_for(timeout)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    sleep 0.1 until yield || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    yield
  end

  # Runs `operations` jobs (plus a redelivery of every fifth), each body taking `work`
  # seconds (none by default: the threads are claiming or completing most of the time,
  # so the fault meets the gem's calls), through a real Sidekiq; once a quarter have
  # run, calls the fault block. Returns the figures.
  def run_with_fault(name, url: @db.url, settings: {}, work: 0)
    pid = start_sidekiq(url, settings, work)
    ops = (1..operations).to_a
    Sidekiq::Client.push_bulk("class" => "FaultJob", "args" => (ops + ops.select { |o| (o % 5).zero? }).map { [_1] })
    begin
      raise "sidekiq did not start working (see #{dir}/sidekiq.log)" unless
        wait_for(60) { lines("effects").size >= operations / 4 }

      fault = yield
      drained = wait_for(90) { drained? }
    ensure
      stop_sidekiq(pid)
    end
    figures(name, ops, fault, drained)
  end

  def figures(name, ops, fault, drained)
    runs = lines("effects").map { |l| Integer(l.split.first) }.tally
    claims = lines("claims").map(&:to_f)
    out = { name:, operations: ops.size, failed_jobs: lines("failures").size, run_twice: runs.count { |_, n| n > 1 },
            lost: ops.count { |o| runs[o].nil? }, records: statuses, drained:, longest_claim: claims.max&.round(2),
            longest_completion: longest("completions"), claims_over_1s: claims.count { |c| c > 1 },
            unrecorded_completions:, **fault }
    puts "\n  fault figures: #{out.map { |k, v| "#{k}=#{v}" }.join(" ")}"
    out
  end

  def longest(name)
    lines(name).map(&:to_f).max&.round(2)
  end

  def statuses
    @db.with_connection do |c|
      c.exec("SELECT status, count(*) FROM idempotent_job_records GROUP BY 1").to_h do |r|
        [r["status"], r["count"].to_i]
      end
    end
  end

  def unrecorded_completions
    File.read(File.join(dir, "sidekiq.log")).scan("completion could not be recorded").size
  end

  def expect_nothing_lost_or_repeated(out)
    expect(out).to include(drained: true, run_twice: 0, lost: 0, unrecorded_completions: 0)
    expect(out[:records]).to eq("completed" => operations)
  end

  it "a restart (pg_ctl stop, 1 s down, start): no job fails, none runs twice, none is lost" do
    out = run_with_fault("restart") { { restart_seconds: @db.restart(down: 1).round(2) } }
    expect_nothing_lost_or_repeated(out)
    expect(out[:failed_jobs]).to eq(0), "#{out[:failed_jobs]} jobs failed; first: #{lines("failures").first}"
  end

  it "pg_terminate_backend of the gem's connections: no job fails, none runs twice, none is lost" do
    out = run_with_fault("terminate_backend") do
      { terminated: Array.new(5) { @db.terminate("idempotent_job_faults").tap { sleep 0.3 } }.sum }
    end
    expect_nothing_lost_or_repeated(out)
    expect(out[:failed_jobs]).to eq(0), "#{out[:failed_jobs]} jobs failed; first: #{lines("failures").first}"
  end

  it "every connection reset by the network: none runs twice, none is lost" do
    out = run_with_fault("reset", url: @db.url(@proxy.port)) do
      { reset_sockets: Array.new(5) { @proxy.reset!.tap { sleep 0.3 } }.sum }
    end
    expect_nothing_lost_or_repeated(out)
    expect(out[:failed_jobs]).to eq(0), "#{out[:failed_jobs]} jobs failed; first: #{lines("failures").first}"
  end

  it "a blackholed network: every claim ends within the deadline + 1 s, and work resumes after the restore" do
    deadline = 2
    outage = 8
    out = run_with_fault("blackhole", url: @db.url(@proxy.port), settings: { deadline: }) do
      @proxy.blackhole!
      sleep outage
      effects_before = lines("effects").size
      restored_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @proxy.restore!
      # The circuit stays open at most 30 s (the core's CIRCUIT_MAX_OPEN_SECONDS) before it
      # tries again: work must resume within that, whatever the machine's load.
      resumed = wait_for(35) { lines("effects").size > effects_before + 5 }
      { outage_seconds: outage, deadline:, resumed:,
        recovery_seconds: (Process.clock_gettime(Process::CLOCK_MONOTONIC) - restored_at).round(2) }
    end
    expect_nothing_lost_or_repeated(out)
    expect(out[:resumed]).to be(true), "no job ran within 35 s of the restore (#{out[:recovery_seconds]} s)"
    expect(out[:claims_over_1s]).to be_positive # claims did meet the dead network
    expect(out[:longest_claim]).to be <= deadline + 1
  end
end
