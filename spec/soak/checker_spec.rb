# frozen_string_literal: true

require "spec_helper"
require "tmpdir"
require_relative "../../soak/jobs"
require_relative "../../soak/plan"
require_relative "../../soak/fleet"
require_relative "../../soak/operator"
require_relative "../../soak/evidence"
require_relative "../../soak/checker"
require_relative "../../soak/log_scan"

# The soak's checks on hand-made evidence: each invariant passes when it holds and is
# reported when it is broken (a check that cannot fail proves nothing).
RSpec.describe "The soak's checker" do
  let(:chaos) { Struct.new(:kills, :restarts).new([], []) }
  let(:journal) { [] }
  let(:calls) { [] }
  let(:records) { {} }
  let(:ledger) { {} }
  let(:resolutions) { {} }
  let(:now) { 1_000_000.0 }

  def operation(job, key = "k1")
    Soak::Plan::Operation.new(index: 0, job_class: "Soak::#{job}", key:, amount_cents: 100)
  end

  def record(operation, status: "completed", token: "t1", attempts: 1, **extra)
    records[operation.reference] = {
      "job_type" => operation.job_class, "operation_key" => operation.key, "status" => status, "claim_token" => token,
      "attempts" => attempts, "takeovers" => 0, "duplicates" => 0, "last_claim" => "first", "resolution" => nil,
      "held_at" => nil, "given_up_at" => nil, "claimed_at" => Time.at(now), "lease_expired_for" => 0
    }.merge(extra.transform_keys(&:to_s))
  end

  def call(operation, token:, attempt:, worker:, at: now)
    calls << { "reference" => operation.reference, "token" => token, "attempt" => attempt, "worker" => worker,
               "at" => at }
  end

  def claimed(operation, attempt:, worker:, at:, kind: "first")
    journal << { "kind" => "claimed", "reference" => operation.reference, "attempt" => attempt, "worker" => worker,
                 "at" => at, "claim" => kind }
  end

  def kill(worker, at:, requeued: [])
    chaos.kills << Soak::Fleet::Kill.new(worker:, pid: 1, at:, requeued:)
  end

  def check(*operations)
    evidence = Soak::Evidence.new(records:, ledger:, calls:, journal:, chaos:)
    Soak::Checker.new(Struct.new(:operations).new(operations), evidence, resolutions)
  end

  # A :reclaim operation taken over after its holder w1 died: w1's effect (attempt 1), then w2's (attempt 2).
  def reclaimed_twice(reclaimed, kill_at:)
    op = reclaimed
    record(op, token: "t2", attempts: 2, takeovers: 1, last_claim: "takeover", claimed_at: Time.at(now + 6))
    claimed(op, attempt: 1, worker: "w1", at: now)
    call(op, token: "t1", attempt: 1, worker: "w1", at: now + 0.1)
    claimed(op, attempt: 2, worker: "w2", at: now + 6, kind: "takeover")
    call(op, token: "t2", attempt: 2, worker: "w2", at: now + 6.1)
    kill("w1", at: kill_at)
  end

  it "passes an operation whose completing claim made its only effect" do
    op = operation("ReclaimJob")
    record(op)
    call(op, token: "t1", attempt: 1, worker: "w1")
    expect(check(op).violations).to be_empty
  end

  it "accepts a :reclaim duplicate whose first effect was followed by its worker's SIGKILL" do
    op = operation("ReclaimJob")
    reclaimed_twice(op, kill_at: now + 0.2)
    checker = check(op)
    expect(checker.violations).to be_empty
    expect(checker.orphaned_effects.fetch(:kill).size).to eq(1)
  end

  it "reports a :reclaim duplicate whose first worker was never killed" do
    op = operation("ReclaimJob")
    reclaimed_twice(op, kill_at: now + 0.2)
    chaos.kills.clear
    expect(check(op).violations).to include(
      a_string_matching(/did not end in a completion, yet its worker was not killed/),
      a_string_matching(/takeover .* while the holder may have been alive/)
    )
  end

  it "reports a takeover that came before its holder was killed (a live holder overtaken)" do
    op = operation("ReclaimJob")
    reclaimed_twice(op, kill_at: now + 30)
    expect(check(op).violations).to include(a_string_matching(/did not end in a completion/),
                                            a_string_matching(/while the holder may have been alive/))
  end

  it "reports a second effect under :hold, and one under :skip" do
    hold = operation("HoldJob")
    skip = operation("SkipJob")
    [hold, skip].each do |op|
      record(op)
      call(op, token: "t1", attempt: 1, worker: "w1")
      call(op, token: "t1", attempt: 1, worker: "w1")
    end
    expect(check(hold, skip).violations).to include(a_string_matching(/HoldJob.*2 effect calls under :hold/),
                                                    a_string_matching(/SkipJob.*2 effect calls under :skip/),
                                                    a_string_matching(/made the effect 2 times/))
  end

  it "explains a held operation by its killed holder, and one given up without a dead holder as a violation" do
    held = operation("HoldJob", "k1")
    given_up = operation("SkipJob", "k2")
    record(held, token: "t2", attempts: 2, takeovers: 1, last_claim: "takeover", resolution: "done")
    claimed(held, attempt: 1, worker: "w1", at: now)
    call(held, token: "t1", attempt: 1, worker: "w1", at: now + 0.1)
    kill("w1", at: now + 0.2)
    resolutions[held.reference] = Soak::Operator::Resolution.new(as: :done, attempts: 2, held_at: now + 6)
    record(given_up, status: "given_up", token: "t2", attempts: 2, takeovers: 1, last_claim: "takeover",
                     given_up_at: Time.at(now + 6))
    claimed(given_up, attempt: 1, worker: "w3", at: now)
    checker = check(held, given_up)
    expect(checker.results.first.reason).to match(/holder w1 SIGKILLed/)
    expect(checker.violations).to eq(["Soak::SkipJob/k2: taken over (attempt 2) while its holder may have been alive"])
  end

  it "explains a takeover of a claim lost to the PostgreSQL restart" do
    op = operation("SkipJob")
    chaos.restarts << [now - 1, now + 1]
    record(op, status: "given_up", token: "t2", attempts: 2, takeovers: 1, last_claim: "takeover",
               given_up_at: Time.at(now + 6))
    journal << { "kind" => "failed", "reference" => op.reference, "at" => now,
                 "error" => "IdempotentJob::ConnectionError", "message" => "the database system is shutting down" }
    checker = check(op)
    expect(checker.violations).to be_empty
    expect(checker.results.first.reason).to match(/orphaned by the PostgreSQL restart/)
  end

  it "accepts a :reclaim duplicate after a completion that could not be recorded while PostgreSQL restarted" do
    op = operation("ReclaimJob")
    reclaimed_twice(op, kill_at: now + 0.2)
    chaos.kills.clear
    chaos.restarts << [now, now + 2]
    journal << { "kind" => "unrecorded_completion", "reference" => op.reference, "token" => "t1", "attempt" => 1,
                 "worker" => "w1", "at" => now + 1.5 }
    checker = check(op)
    expect(checker.violations).to be_empty
    expect(checker.orphaned_effects.fetch(:restart).size).to eq(1)
  end

  it "blames no duplicate on a completion left unrecorded long after the restart" do
    op = operation("ReclaimJob")
    reclaimed_twice(op, kill_at: now + 0.2)
    chaos.kills.clear
    chaos.restarts << [now - 100, now - 99]
    journal << { "kind" => "unrecorded_completion", "reference" => op.reference, "token" => "t1", "attempt" => 1,
                 "worker" => "w1", "at" => now + 1.5 }
    expect(check(op).violations).to include(a_string_matching(/did not end in a completion/))
  end

  it "reports a transactional operation with two ledger rows, or none" do
    twice = operation("LedgerJob", "k1")
    never = operation("LedgerJob", "k2")
    [twice, never].each { |op| record(op) }
    ledger.merge!("k1" => 2)
    expect(check(twice, never).violations).to eq(["Soak::LedgerJob/k1: 2 ledger rows, expected exactly 1",
                                                  "Soak::LedgerJob/k2: 0 ledger rows, expected exactly 1"])
  end

  it "reports lost operations: never claimed, or left claimed with nobody holding the claim" do
    never = operation("ReclaimJob", "k1")
    left = operation("HoldJob", "k2")
    record(left, status: "claimed", lease_expired_for: 40)
    expect(check(never, left).violations).to eq(
      ["Soak::ReclaimJob/k1: lost: no idempotency record (never claimed)",
       "Soak::HoldJob/k2: lost: left claimed, its lease ran out 40 s ago, no worker holds it (attempts 1, " \
       "last error nil)"]
    )
  end

  it "reports effects of an operation nobody enqueued" do
    op = operation("ReclaimJob")
    call(operation("ReclaimJob", "stray"), token: "t9", attempt: 1, worker: "w1")
    record(op)
    call(op, token: "t1", attempt: 1, worker: "w1")
    expect(check(op).violations).to eq(["Soak::ReclaimJob/stray: effect calls for an operation the producer never " \
                                        "enqueued"])
  end
end

RSpec.describe "The soak's log scan" do
  let(:dir) { Dir.mktmpdir }
  let(:restart) { [Time.iso8601("2026-01-01T10:00:00Z").to_f, Time.iso8601("2026-01-01T10:00:01Z").to_f] }

  after { FileUtils.remove_entry(dir) }

  def line(time, level, message, tid: "t1")
    JSON.generate({ ts: time, pid: 1, tid:, lvl: level, msg: message })
  end

  def scan(*lines)
    File.write(File.join(dir, "w1-1.log"), "#{lines.join("\n")}\n")
    Soak::LogScan.new([restart]).scan([File.join(dir, "w1-1.log")])
  end

  def failure(time, error)
    [line(time, "WARN", '{"context":"Job raised exception","job":{}}'), line(time, "WARN", error),
     line(time, "WARN", "/app/lib/x.rb:1:in `call'")]
  end

  it "expects connection errors while PostgreSQL restarts and the gem's stale-claim decisions" do
    scan = scan(*failure("2026-01-01T10:00:02.000Z", "IdempotentJob::ConnectionError: the database system is " \
                                                     "shutting down"),
                line("2026-01-01T10:05:00.000Z", "WARN", 'idempotent_job: Soak::HoldJob operation "k" (jid j, ' \
                                                         "attempt 2) is stale (x): held for a person"),
                line("2026-01-01T10:05:00.000Z", "INFO", "done"))
    expect(scan.unexpected).to be_empty
    expect(scan.expected.values.sum).to eq(2)
  end

  it "reports connection errors long after the restart, other errors, and lines that are not log lines" do
    scan = scan(*failure("2026-01-01T10:05:00.000Z", "IdempotentJob::ConnectionError: refused"),
                *failure("2026-01-01T10:00:02.000Z", "Soak::StandIn::Error: stand-in unreachable"),
                line("2026-01-01T10:05:00.000Z", "ERROR", "idempotent_job: lost the claim of x"),
                "ruby: warning: something")
    expect(scan.unexpected.map(&:text)).to eq(
      ["delivery failed: IdempotentJob::ConnectionError: refused",
       "delivery failed: Soak::StandIn::Error: stand-in unreachable",
       "idempotent_job: lost the claim of x", "not a log line: ruby: warning: something"]
    )
  end
end
