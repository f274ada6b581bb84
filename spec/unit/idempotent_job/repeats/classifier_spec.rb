# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/repeats/classifier"

RSpec.describe IdempotentJob::Repeats::Classifier do
  let(:t0) { 1_764_547_200.0 } # 2025-12-01 00:00 UTC

  def delivery(at, jid, **facts)
    { "at" => t0 + at, "jid" => jid, "decision" => "completed", "enqueued_at" => t0 + at - 0.01,
      "producer" => "app/controllers/orders_controller.rb:42" }.merge(facts.transform_keys(&:to_s)).compact
  end

  def causes(deliveries, **options)
    described_class.classify(deliveries, **options).map(&:cause)
  end

  it "calls copies that met a live claim concurrent copies, and their deferred returns the same, flagged" do
    first = delivery(0, "a", decision: "claimed")
    copies = %w[b c d e].map { |jid| delivery(0.002, jid, decision: "in_progress") }
    returns = %w[b c d e].map { |jid| delivery(1.0, jid, deferrals: 1) }
    repeats = described_class.classify([first, *copies, *returns])
    expect(repeats.map(&:cause)).to eq([:concurrent_copy] * 8)
    expect(repeats.map(&:deferred_return)).to eq(([false] * 4) + ([true] * 4))
    expect(repeats.first).to have_attributes(live_claim: true, id: "b")
    expect(repeats.first.after_claim).to be_within(1e-6).of(0.002)
    # One id delivered twice, each copy deferred: both returns are returns.
    twice = [first, delivery(0.01, "b", decision: "in_progress"), delivery(0.02, "b", decision: "in_progress"),
             delivery(1.0, "b", deferrals: 1), delivery(1.1, "b", deferrals: 1)]
    expect(described_class.classify(twice).map { |r| [r.cause, r.deferred_return] })
      .to eq([[:concurrent_copy, false], [:redelivery, false], [:concurrent_copy, true], [:concurrent_copy, true]])
  end

  it "tells the queue's retry (same id, higher retry_count) from a redelivery (same id, no new retry)" do
    deliveries = [delivery(0, "a", decision: "claimed"), delivery(30, "a", retry_count: 0, decision: "claimed"),
                  delivery(90, "a", retry_count: 1, decision: "claimed"), delivery(400, "a", retry_count: 1)]
    expect(causes(deliveries)).to eq(%i[queue_retry queue_retry redelivery])
    active_job = [{ "at" => t0, "job_id" => "x", "executions" => 1, "decision" => "claimed" },
                  { "at" => t0 + 3, "job_id" => "x", "executions" => 2, "decision" => "claimed" },
                  { "at" => t0 + 9, "job_id" => "x", "executions" => 2, "decision" => "completed" }]
    expect(described_class.classify(active_job).map { |r| [r.cause, r.id, r.retry_count] })
      .to eq([[:queue_retry, "x", 1], [:redelivery, "x", 1]])
  end

  it "reads the Celery door's facts: task_id and retries" do
    celery = ->(at, id, **facts) { { "at" => t0 + at, "task_id" => id, "retries" => 0 }.merge(facts) }
    deliveries = [celery.call(0, "a", "decision" => "claimed"), celery.call(0.01, "b", "decision" => "in_progress"),
                  celery.call(2, "b", "decision" => "completed", "deferrals" => 1),
                  celery.call(3, "a", "decision" => "claimed", "retries" => 1),
                  celery.call(9, "a", "decision" => "completed", "retries" => 1)]
    expect(described_class.classify(deliveries).map { |r| [r.cause, r.id, r.deferred_return] })
      .to eq([[:concurrent_copy, "b", false], [:concurrent_copy, "b", true], [:queue_retry, "a", false],
              [:redelivery, "a", false]])
  end

  it "matches a redelivery to the deploy or restart it follows, within the window" do
    deploy = Time.at(t0 + 350)
    deliveries = [delivery(0, "a", decision: "claimed"), delivery(400, "a"), delivery(1000, "a")]
    repeats = described_class.classify(deliveries, restarts: [Time.at(t0 - 5000), deploy], restart_window: 120)
    expect(repeats.map(&:cause)).to eq(%i[redelivery redelivery])
    expect(repeats.map(&:restart)).to eq([deploy, nil])
    # The default window is the core's (Native::DEFAULT_RESTART_WINDOW, 120 s): 50 s after is within it.
    expect(described_class.classify(deliveries, restarts: [deploy]).map(&:restart)).to eq([deploy, nil])
    # Both arrivals after the restart (one payload pushed twice): not caused by it.
    twice = [delivery(360, "a", decision: "claimed"), delivery(360.01, "a")]
    expect(described_class.classify(twice, restarts: [deploy], restart_window: 120).map { |r| [r.cause, r.restart] })
      .to eq([[:redelivery, nil]])
  end

  it "tells a re-enqueue by a producer seen before from one by another, and says when it cannot" do
    deliveries = [delivery(0, "a", decision: "claimed"), delivery(3600, "b"),
                  delivery(7200, "c", producer: "app/webhooks/stripe_webhook.rb:17"),
                  delivery(7300, "d", producer: "app/webhooks/stripe_webhook.rb:17"),
                  delivery(7400, "e", producer: nil)]
    repeats = described_class.classify(deliveries)
    expect(repeats.map(&:cause)).to eq(%i[re_enqueue_same_producer re_enqueue_other_producer re_enqueue_same_producer
                                          re_enqueue])
    expect(repeats.map(&:first_producer).uniq).to eq(["app/controllers/orders_controller.rb:42"])
    expect(causes([delivery(0, "a", producer: nil), delivery(60, "b")])).to eq([:re_enqueue])
  end

  it "measures each repeat after the claim and after its own enqueue, reading Sidekiq 8's milliseconds" do
    deliveries = [delivery(0, "a", decision: "claimed"),
                  delivery(120, "b", enqueued_at: ((t0 + 100) * 1000).to_i, created_at: nil)]
    repeat = described_class.classify(deliveries).first
    expect(repeat.after_claim).to be_within(1e-6).of(120)
    expect(repeat.after_enqueue).to be_within(1e-3).of(20)
    expect(repeat.at).to eq(Time.at(t0 + 120))
    expect(described_class.seconds(1_764_547_200_123)).to be_within(1e-6).of(1_764_547_200.123)
    expect(described_class.seconds(nil)).to be_nil
    expect(described_class.seconds("2025-12-01T00:00:01Z")).to eq(t0 + 1)
    expect(described_class.seconds("yesterday")).to be_nil
  end

  it "has nothing to classify without deliveries, and says so of a repeat recorded without facts" do
    expect(described_class.classify([])).to eq([])
    expect(causes([delivery(0, "a"), { "at" => t0 + 5 }])).to eq([:unknown])
    expect(causes([delivery(0, "a"), { "at" => t0 + 0.1 }, { "at" => t0 + 5 }], completed_at: Time.at(t0 + 1)))
      .to eq(%i[concurrent_copy unknown])
  end

  it "counts operations per job type and pair of producers that both enqueued them" do
    op = Struct.new(:job_type, :producers)
    pairs = described_class.producer_pairs([op.new("ChargeOrderJob", %w[orders stripe]),
                                            op.new("ChargeOrderJob", %w[stripe orders orders]),
                                            op.new("ChargeOrderJob", ["orders"]), op.new("RefundJob", ["a", nil, "b"])])
    expect(pairs).to eq({ %w[ChargeOrderJob orders stripe] => 2, %w[RefundJob a b] => 1 })
  end

  it "calls a copy answered 'completed' that arrived before the completion (a row-lock wait) a concurrent copy" do
    deliveries = [delivery(0, "a", decision: "claimed"), delivery(0.01, "b"), delivery(2, "c")]
    repeats = described_class.classify(deliveries, completed_at: Time.at(t0 + 0.85))
    expect(repeats.map(&:cause)).to eq(%i[concurrent_copy re_enqueue_same_producer])
    expect(repeats.map(&:live_claim)).to eq([true, false])
  end

  it "calls a delivery that took over a dead worker's claim, and its deferred arrivals before, a redelivery" do
    restart = Time.at(t0 + 1)
    deliveries = [delivery(0, "a", decision: "claimed"), delivery(2, "b", decision: "in_progress"),
                  delivery(6, "b", decision: "takeover", deferrals: 1), delivery(7, nil, decision: "takeover"),
                  delivery(8, "c", decision: "in_progress")]
    repeats = described_class.classify(deliveries, restarts: [restart], restart_window: 5)
    expect(repeats.map(&:cause)).to eq(%i[redelivery redelivery redelivery concurrent_copy])
    expect(repeats.map(&:deferred_return)).to eq([false, true, false, false])
    expect(repeats.map(&:restart)).to eq([restart, nil, nil, nil])
  end
end
