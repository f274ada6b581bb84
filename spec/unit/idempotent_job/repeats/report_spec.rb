# frozen_string_literal: true

require "csv"
require "spec_helper"
require "idempotent_job/repeats/report"

RSpec.describe IdempotentJob::Repeats::Report do
  let(:t0) { 1_764_547_200.0 }
  let(:orders) { "app/controllers/orders_controller.rb:42" }
  let(:stripe) { "app/webhooks/stripe_webhook.rb:17" }

  def facts(at, jid, decision = "completed", producer: orders, **more)
    { "at" => t0 + at, "jid" => jid, "decision" => decision, "producer" => producer,
      "enqueued_at" => t0 + at - 0.5 }.merge(more.transform_keys(&:to_s))
  end

  # The demo's scenarios, as their facts would be recorded.
  let(:rows) do
    [{ job_type: "ChargeOrderJob", operation_key: "1", status: :completed, # five copies pushed at once
       deliveries: [facts(0, "a", "claimed"), *%w[b c d e].map { |j| facts(0.01, j, "in_progress") },
                    *%w[b c d e].map { |j| facts(1.2, j, deferrals: 1) }] },
     { job_type: "ChargeOrderJob", operation_key: "2", status: :completed, # enqueued by two producers
       deliveries: [facts(0, "f", "claimed"), facts(3600, "g", producer: stripe), facts(7200, "h")] },
     { job_type: "ShipParcelJob", operation_key: "3", status: :completed, # raised once, then the killed worker
       deliveries: [facts(0, "i", "claimed"), facts(20, "i", "claimed", retry_count: 0),
                    facts(500, "i", "claimed", retry_count: 0)] }]
  end

  let(:report) { described_class.new(rows, restarts: [Time.at(t0 + 450)]) }

  it "classifies each scenario's repeats and counts them per job type, deferred returns apart" do
    expect(report.operations.map { |op| op.repeats.map(&:cause).tally }).to eq(
      [{ concurrent_copy: 8 }, { re_enqueue_other_producer: 1, re_enqueue_same_producer: 1 },
       { queue_retry: 1, redelivery: 1 }]
    )
    expect(report.summary["ChargeOrderJob"]).to include(operations: 2, repeats: 6, concurrent_copy: 4,
                                                        re_enqueue_other_producer: 1, re_enqueue_same_producer: 1,
                                                        deferred_returns: 4, several_producers: 1)
    expect(report.summary["ShipParcelJob"]).to include(queue_retry: 1, redelivery: 1, near_restart: 1)
  end

  it "names the two producers that enqueue the same operation" do
    expect(report.producer_pairs).to eq({ ["ChargeOrderJob", orders, stripe] => 1 })
    expect(report.lines).to include(
      "#{orders} and #{stripe} both enqueue ChargeOrderJob for the same operation: 1 operation"
    )
  end

  it "reads as text: per operation, per job type" do
    lines = report.lines
    expect(lines[0]).to start_with('ChargeOrderJob "1": completed, 4 repeats (concurrent copy after 0.0 s, ')
    expect(lines[0]).to include("concurrent copy after 1.2 s (deferred copy back)")
    expect(lines[1]).to eq('ChargeOrderJob "2": completed, 2 repeats (re-enqueue, other producer after 3600.0 s by ' \
                           "#{stripe}, re-enqueue, same producer after 7200.0 s); enqueued by 2 producers: " \
                           "#{orders}, #{stripe}")
    expect(lines[2]).to include("queue retry after 20.0 s", "redelivery/restart after 500.0 s near the restart at")
    expect(lines).to include("ChargeOrderJob: 2 operations repeated 6 times — 4 concurrent copy, 1 re-enqueue, same " \
                             "producer, 1 re-enqueue, other producer; 4 deferred copies back, 1 enqueued by several " \
                             "producers")
  end

  it "counts in the singular for one (1 repeat, 1 operation repeated 1 time, 1 stale claim)" do
    row = { job_type: "EmailJob", operation_key: "9", status: :completed, takeovers: 1, mismatches: 1,
            deliveries: [facts(0, "x", "claimed"), facts(0.01, "y", "in_progress"), facts(1.2, "y", deferrals: 1)] }
    lines = described_class.new([row], restarts: []).lines
    expect(lines[0]).to start_with('EmailJob "9": completed, 1 repeat (concurrent copy after 0.0 s, ')
    expect(lines[0]).to end_with("; 1 delivery with different arguments (payload digest); 1 stale claim taken over")
    expect(lines[1]).to eq("EmailJob: 1 operation repeated 1 time — 1 concurrent copy; 1 deferred copy back")
  end

  it "exports one CSV row per repeat" do
    rows = CSV.parse(report.to_csv, headers: true)
    expect(rows.headers).to eq(described_class::CSV_HEADERS)
    expect(rows.size).to eq(12)
    other = rows.find { |r| r["cause"] == "re_enqueue_other_producer" }
    expect(other.to_h).to include("job_type" => "ChargeOrderJob", "operation_key" => "2", "delivery_id" => "g",
                                  "after_claim_s" => "3600.0", "after_enqueue_s" => "0.5", "live_claim" => "false",
                                  "producer" => stripe, "first_producer" => orders,
                                  "at" => "2025-12-01T01:00:00.000000Z")
    expect(rows.find { |r| r["cause"] == "redelivery" }["restart_at"]).to eq("2025-12-01T00:07:30Z")
  end

  it "neutralises CSV cells a spreadsheet would run as a formula (=, +, -, @, tab, CR) with a leading quote" do
    hostile = ["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3", "@SUM(A1)", "\tcmd", "\rcmd"]
    hostile_rows = hostile.each_with_index.map do |text, i|
      { job_type: "J#{i}", operation_key: text, status: :completed,
        deliveries: [facts(0, "a#{i}", "claimed"), facts(60, "b#{i}", producer: text)] }
    end
    rows = CSV.parse(described_class.new(hostile_rows).to_csv, headers: true)
    expect(rows.map { |r| r["operation_key"] }).to eq(hostile.map { |t| "'#{t}" })
    expect(rows.map { |r| r["producer"] }).to eq(hostile.map { |t| "'#{t}" })
    expect(rows.map { |r| r["first_producer"] }).to all(eq(orders))
    expect(rows.map { |r| r["after_claim_s"] }).to all(eq("60.0"))
    safe = CSV.parse(report.to_csv, headers: true)
    expect(safe.map { |r| r["operation_key"] }.uniq).to eq(%w[1 2 3])
  end

  it "reads a record's first claim and repeat elements as deliveries" do
    deliveries = described_class.deliveries(
      first_claimed_at: Time.at(t0), first_facts: { "jid" => "a", "producer" => orders },
      repeat_facts: [{ "at" => "2025-12-01T00:00:00.5+00:00", "job_class" => "ChargeOrderJob",
                       "decision" => "in_progress", "facts" => { "jid" => "b" } },
                     { "at" => t0 + 30, "decision" => "retry", "facts" => { "jid" => "a", "retry_count" => 0 } },
                     { "at" => (t0 + 60) * 1000, "decision" => "completed", "facts" => nil }]
    )
    expect(deliveries).to eq([{ "jid" => "a", "producer" => orders, "at" => t0, "decision" => "claimed" },
                              { "jid" => "b", "at" => t0 + 0.5, "job_class" => "ChargeOrderJob",
                                "decision" => "in_progress" },
                              { "jid" => "a", "retry_count" => 0, "at" => t0 + 30, "job_class" => nil,
                                "decision" => "claimed" },
                              { "at" => t0 + 60, "job_class" => nil, "decision" => "completed" }])
    expect(IdempotentJob::Repeats::Classifier.classify(deliveries).map(&:cause))
      .to eq(%i[concurrent_copy queue_retry re_enqueue])
  end

  it "reads each of the demo's other scenarios as what it is" do
    completed = ->(at) { Time.at(t0 + at) }
    rows = [
      # (a) 3 enqueues, 2 s apart; (c) one jid twice; (d) its worker killed; (h) 5 copies at once
      { job_type: "ChargeOrderJob", operation_key: "a", status: :completed, completed_at: completed[0.8],
        deliveries: [facts(0, "a1", "claimed"), facts(2, "a2"), facts(4, "a3")] },
      { job_type: "ChargeOrderJob", operation_key: "c", status: :completed, completed_at: completed[0.8],
        deliveries: [facts(0, "c1", "claimed"), facts(0.01, "c1", "in_progress"), facts(1.5, "c1", deferrals: 1)] },
      { job_type: "CaptureOrderJob", operation_key: "d", status: :completed, completed_at: completed[9],
        deliveries: [facts(0, "d1", "claimed"), facts(3, "d2", "in_progress"),
                     facts(6, "d2", "takeover", deferrals: 1)] },
      { job_type: "LedgerEntryJob", operation_key: "h", status: :completed, completed_at: completed[0.85],
        deliveries: [facts(0, "h1", "claimed"), *%w[h2 h3 h4 h5].map { |j| facts(0.001, j) }] }
    ]
    report = described_class.new(rows, restarts: [Time.at(t0 + 2)], restart_window: 2)
    expect(report.operations.to_h { |op| [op.operation_key, op.repeats.map { |r| [r.cause, r.deferred_return] }] })
      .to eq("a" => [[:re_enqueue_same_producer, false]] * 2,
             "c" => [[:redelivery, false], [:redelivery, true]],
             "d" => [[:redelivery, false], [:redelivery, true]],
             "h" => [[:concurrent_copy, false]] * 4)
    expect(report.operations[2].repeats.first.restart).to eq(Time.at(t0 + 2))
  end

  it "reads the report SQL's row: repeat facts, the first claim's delivery id, and old records' times alone" do
    row = { job_type: "ChargeOrderJob", operation_key: "9", status: :completed, attempts: 1, takeovers: 0,
            duplicates: 2, mismatches: 0, first_claimed_at: Time.at(t0), completed_at: Time.at(t0 + 1), jid: "a",
            job_classes: ["ChargeOrderJob"], repeat_times: [Time.at(t0 + 0.1), Time.at(t0 + 9)],
            repeat_facts_json: JSON.generate([{ "at" => "2025-12-01T00:00:09Z", "decision" => "completed",
                                                "facts" => { "jid" => "a" } },
                                              { "at" => "2025-12-01T00:00:00.1Z", "decision" => "in_progress",
                                                "facts" => { "jid" => "b" } }]) }
    op = described_class.new([described_class.row(row)]).operations.first
    expect(op.repeats.map(&:cause)).to eq(%i[concurrent_copy redelivery])
    expect(op).to have_attributes(duplicates: 2, job_classes: ["ChargeOrderJob"], notes: [])
    old = described_class.new([described_class.row(row.merge(repeat_facts_json: "[]"))]).operations.first
    expect(old.repeats.map(&:cause)).to eq(%i[concurrent_copy unknown])
  end
end
