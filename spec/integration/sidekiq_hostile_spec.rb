# frozen_string_literal: true

require "spec_helper"
require "sidekiq/api"
require "securerandom"
require_relative "../support/sidekiq_processes"
require_relative "../support/hostile_values"

# The shared table of hostile values (conformance/hostile.json, issue 29) through a real
# `sidekiq` process: each case's JSON text written into Redis as another language's
# producer would (Sidekiq's own client refuses most of them before Redis: NaN, nesting
# over 100), twice as the operation key and twice as a payload, and once more as the
# body's result (built in the worker). For each: the process survives, the body runs at
# most once, and a delivery refused — by the library (its error naming the job and the
# problem) or by Sidekiq's own JSON parser (nesting over 100, NaN tokens) — lands in
# Sidekiq's dead set (HostileSidekiqJob has no retries), never acknowledged silently.
RSpec.describe "Hostile values through a real Sidekiq process", :integration do
  include SidekiqProcesses

  let(:root) { File.expand_path("../..", __dir__) }
  let(:log) { File.join(root, "tmp", "spec-sidekiq-hostile.log") }

  around do |example|
    Sidekiq::Testing.disable! do
      Sidekiq.redis(&:flushdb)
      example.run
    end
  end

  def start_sidekiq
    Process.spawn({ "REDIS_URL" => ENV.fetch("REDIS_URL") },
                  "sidekiq", "-r", File.join(root, "spec/support/sidekiq_boot.rb"), "-c", "3", "-q", "default",
                  chdir: root, out: log, err: log, pgroup: true)
  end

  # Writes a job into Redis as a producer in another language would: its arguments as
  # the JSON text `args` (not written by Ruby's JSON, which refuses NaN and deep nesting).
  def push_raw(args)
    now = Time.now.to_f
    job = [%({"class":"HostileSidekiqJob","queue":"default","jid":"#{SecureRandom.hex(12)}","retry":0,),
           %("created_at":#{now},"enqueued_at":#{now},"args":), args, "}"].map(&:b).join
    Sidekiq.redis do |conn|
      conn.sadd("queues", "default")
      conn.lpush("queue:default", job)
    end
  end

  # A case's delivery that Sidekiq's own parser refuses (JSON.parse's default limits:
  # nesting over 100, NaN and Infinity tokens): it lands in the dead set without reaching
  # the library.
  def sidekiq_refuses?(vector, depth)
    make = vector["make"] || {}
    return true if (make["nest"].to_i + depth) > 100 || make.key?("float")

    # Asked of Sidekiq's own parser: json 2.6 (Ruby 3.1) refuses a lone high surrogate
    # escape ("\ud800") and reads a lone low one ("\udc00") as bytes that are not UTF-8.
    Sidekiq.load_json("[#{HostileValues.raw_json(vector)}]")
    false
  rescue JSON::ParserError
    true
  end

  it "keeps the process alive, runs each body at most once and dead-letters every refusal" do
    cases = HostileValues.cases.select { |c| HostileValues.raw_json(c) }
    expected_dead = 0
    pid = start_sidekiq
    begin
      cases.each_with_index do |vector, i|
        text = HostileValues.raw_json(vector)
        2.times { push_raw(%(["k#{i}",#{text},null,null])) }
        2.times { push_raw(%(["p#{i}","p-#{i}",#{text},null])) }
        push_raw(%(["r#{i}","r-#{i}",null,#{JSON.generate(vector["name"])}]))
        expected_dead += 2 if vector["key"] == "refused" || sidekiq_refuses?(vector, 2)
        expected_dead += 2 if vector["payload"] == "refused" || sidekiq_refuses?(vector, 2)
      end
      wait_until(120) { drained? && Sidekiq::DeadSet.new.size >= expected_dead }
      expect(Process.kill(0, pid)).to eq(1) # the process is alive
    ensure
      stop_sidekiq(pid)
    end
    dead = Sidekiq::DeadSet.new.to_a
    expect(dead.size).to eq(expected_dead), dead.map { |job| job.value.b[/"args":\["(\w+)"/n, 1] }.sort.inspect
    cases.each_with_index do |vector, i|
      %w[k key p payload].each_slice(2) do |tag, use|
        refused = vector[use] == "refused" || sidekiq_refuses?(vector, 2)
        expect(Effects.count("#{tag}#{i}")).to eq(refused ? 0 : 1), "#{vector["name"]} as #{use}"
        next if !refused || sidekiq_refuses?(vector, 2)

        messages = dead.select { |job| job.args.first == "#{tag}#{i}" }.map { |job| job.item["error_message"] }
        expect(messages.size).to eq(2), "#{vector["name"]} as #{use}: #{messages.inspect}"
        expect(messages).to all(include("HostileSidekiqJob").and(match(/#{Regexp.escape(vector["problem"])}/i)))
      end
      record = IdempotentJob.record("HostileSidekiqJob", "r-#{i}")
      expect(Effects.count("r#{i}")).to eq(1), vector["name"]
      expect(record.status).to eq(:completed)
      expect(record.result_state == :stored).to eq(vector["result"] == "stored"), vector["name"]
    end
    # Binary: Sidekiq 8 logs a job it cannot parse as its raw text, bytes that are not UTF-8 included.
    expect(File.binread(log)).not_to match(/SystemStackError|Segmentation fault|SIGSEGV/n)
  end

  def wait_until(timeout)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    sleep 0.5 until yield || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
  end
end
