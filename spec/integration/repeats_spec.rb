# frozen_string_literal: true

require "spec_helper"
require "csv"
require "open3"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"

# The repeats report on a fixture history whose facts are known (what the doors record:
# delivery id, retry count, producer, the claim's answer), on a record kept before facts
# were recorded, and on real deliveries through the Sidekiq door.
RSpec.describe "The repeats report", :integration do
  let(:now) { Time.at(Time.now.to_i) }
  let(:restart) { now - 600 }
  let(:orders) { "app/controllers/orders_controller.rb:42" }
  let(:stripe) { "app/webhooks/stripe_webhook.rb:17" }

  def iso(ago) = (now - ago).utc.iso8601(6)

  def element(ago, decision, **facts)
    { "at" => iso(ago), "job_class" => "ChargeOrderJob", "decision" => decision,
      "facts" => facts.transform_keys(&:to_s) }
  end

  # A completed record first claimed `first_ago` seconds ago by delivery "j-<key>" of
  # the orders controller, with these repeat elements (`times` alone: a record from
  # before repeat facts).
  def history!(key, first_ago:, repeats: [], times: nil, completed_ago: nil)
    times ||= repeats.map { |e| e["at"] }
    first = { "jid" => "j-#{key}", "producer" => orders }
    params = [key, now - first_ago, "{#{times.join(",")}}", JSON.generate(first),
              JSON.generate(repeats, max_nesting: false),
              now - (completed_ago || (first_ago - 1))]
    Effects.connection.exec_params(<<~SQL, params)
      INSERT INTO idempotent_job_records
        (job_type, operation_key, status, claim_token, jid, lease_seconds, lease_expires_at, first_claimed_at,
         claimed_at, completed_at, repeat_times, job_classes, duplicates, first_facts, repeat_facts)
      VALUES ('History', $1, 'completed', gen_random_uuid(), 'j-' || $1, 30, now(), $2, $2, $6, $3::timestamptz[],
              '{ChargeOrderJob}', cardinality($3::timestamptz[]), $4::jsonb, $5::jsonb)
    SQL
  end

  before do
    history!("copies", first_ago: 3000, completed_ago: 2999,
                       repeats: [element(2999.9, "in_progress", jid: "c2", producer: orders),
                                 element(2998, "completed", jid: "c2", producer: orders, deferrals: 1)])
    history!("retry", first_ago: 7200, completed_ago: 7100,
                      repeats: [element(7195, "retry", jid: "j-retry", retry_count: 0, producer: orders)])
    history!("restart", first_ago: 900, completed_ago: 560,
                        repeats: [element(590, "in_progress", jid: "r2", producer: orders),
                                  element(570, "takeover", jid: "r2", producer: orders, deferrals: 1)])
    history!("two-producers", first_ago: 4 * 3600,
                              repeats: [element(3600, "completed", jid: "t2", producer: stripe),
                                        element(1800, "completed", jid: "t3", producer: orders)])
    history!("before-facts", first_ago: 5000, times: [iso(4000)])
    history!("old", first_ago: 9 * 86_400, repeats: [element(8 * 86_400, "completed", jid: "o2")])
  end

  it "classifies each repeat from its facts, and counts per job type and producer pair" do
    report = IdempotentJob::Repeats.report(since: now - 86_400, job_type: "History", restarts: [restart])
    by_key = report.operations.to_h { |op| [op.operation_key, op] }
    expect(by_key.keys).to contain_exactly("copies", "retry", "restart", "two-producers", "before-facts")
    causes = by_key.transform_values { |op| op.repeats.map { |r| [r.cause, r.deferred_return] } }
    expect(causes).to eq("copies" => [[:concurrent_copy, false], [:concurrent_copy, true]],
                         "retry" => [[:queue_retry, false]],
                         "restart" => [[:redelivery, false], [:redelivery, true]],
                         "two-producers" => [[:re_enqueue_other_producer, false], [:re_enqueue_same_producer, false]],
                         "before-facts" => [[:unknown, false]])
    expect(by_key["restart"].repeats.first.restart).to eq(restart)
    expect(by_key["retry"].repeats.first.after_claim).to be_within(0.001).of(5)
    expect(by_key["two-producers"].notes).to eq(["enqueued by 2 producers: #{orders}, #{stripe}"])
    expect(report.producer_pairs).to eq(["History", orders, stripe] => 1)
    expect(report.summary["History"]).to include(operations: 5, repeats: 6, concurrent_copy: 1, queue_retry: 1,
                                                 redelivery: 1, re_enqueue_other_producer: 1,
                                                 re_enqueue_same_producer: 1, unknown: 1, near_restart: 1,
                                                 deferred_returns: 2, several_producers: 1)
    expect(IdempotentJob.repeats(since: now - 86_400, job_type: "History").size).to eq(5)
  end

  # Before: facts nested 100 levels or more raised JSON::NestingError (Ruby's JSON stops at
  # 100), and at 126-127 the core's own parser refused the record's repeat elements.
  it "reads facts nested as deep as a claim accepts them (the core's MAX_NESTING)" do
    n = IdempotentJob::Native::MAX_NESTING - 2 # facts {"deep" => n + 1 levels} are MAX_NESTING deep
    deep = JSON.parse("#{'{"d":' * n}{}#{"}" * n}", max_nesting: false)
    history!("deep", first_ago: 100, repeats: [element(50, "completed", jid: "d2", producer: stripe, deep:)])
    report = IdempotentJob::Repeats.report(since: now - 86_400, job_type: "History")
    deep_op = report.operations.find { |op| op.operation_key == "deep" }
    expect(deep_op.repeats.map(&:cause)).to eq([:re_enqueue_other_producer])
    expect(report.lines).to include(start_with('History "deep": completed, 1 repeat'))
  end

  it "refuses a job type that is not valid UTF-8, naming the problem" do
    expect { IdempotentJob::Repeats.report(since: now - 60, job_type: "Hist\xFFory") }
      .to raise_error(IdempotentJob::ConfigurationError, /the job type "Hist\\xFFory" is not valid UTF-8/)
  end

  it "sees real repeated deliveries with their producers, and runs as a rake task with CSV" do
    first = __LINE__ + 1
    2.times { ChargeOrderJob.perform_async(42, 1500) }
    ChargeOrderJob.perform_async(42, 1500) # another line of code: another producer
    ChargeOrderJob.drain
    op = IdempotentJob.repeats(job_type: "ChargeOrderJob").find { |o| o.operation_key == "42" }
    here = "spec/integration/repeats_spec.rb"
    expect(op.producers).to eq(["#{here}:#{first}", "#{here}:#{first + 1}"])
    expect(op.repeats.map(&:cause)).to eq(%i[re_enqueue_same_producer re_enqueue_other_producer])

    root = File.expand_path("../..", __dir__)
    dir = File.join(root, "tmp", "rake-repeats")
    FileUtils.mkdir_p(dir)
    File.write(File.join(dir, "Rakefile"), %(require "idempotent_job/rake_tasks"\n))
    csv = File.join(dir, "repeats.csv")
    out, status = Open3.capture2e({ "RUBYLIB" => File.join(root, "lib"), "RESTARTS" => restart.utc.iso8601,
                                    "CSV" => csv }, "rake", "idempotent_job:repeats[24]", chdir: dir)
    expect(status).to be_success, out
    expect(out).to include('History "restart": completed, 1 repeat (redelivery/restart after 310.0 s near the ' \
                           "restart at #{restart.utc.iso8601}, redelivery/restart after 330.0 s (deferred copy back))")
    expect(out).to include("#{orders} and #{stripe} both enqueue History for the same operation: 1 operation")
    expect(out).to match(/^History: 5 operations repeated 6 times — 1 concurrent copy, 1 queue retry, /)
    expect(out).to include("-- the SQL behind this report", IdempotentJob.repeats_sql.strip)
    rows = CSV.read(csv, headers: true)
    expect(rows.find { |r| r["operation_key"] == "two-producers" }.to_h)
      .to include("cause" => "re_enqueue_other_producer", "producer" => stripe, "first_producer" => orders)
  end

  { "native handle" => RecordPaymentJob, "ActiveRecord" => RecordPaymentArJob }.each do |flavour, job_class|
    it "classifies the repeats met inside a transactional claim (#{flavour}): a copy that waited, a re-enqueue" do
      payment = "rep-#{job_class.name}"
      job = job_hash([payment, 500], klass: job_class)
      copy = job.merge("jid" => SecureRandom.hex(12)) # pushed at the same time by the same producer
      SpecHooks.on(:after_effect) { sleep 0.3 } # the first transaction stays open a while
      deliver_at_once(job, copy)
      deliver(job_hash([payment, 500], klass: job_class)) # enqueued again later
      expect(SpecPayment.rows(payment)).to eq(1)

      op = IdempotentJob.repeats(job_type: job_class.name).find { |o| o.operation_key == payment }
      expect(op.repeats.map(&:cause)).to eq(%i[concurrent_copy re_enqueue_same_producer])
      expect(op.repeats.map(&:decision)).to eq(%w[completed completed])
      expect(op.producers).to eq(["spec/support/replay_helpers.rb:9"])
    end
  end

  it "counts replays: repeats answered from a completion that stored a result" do
    since = Time.now - 60
    IdempotentJob.perform_once("ReplayCount", 1, store_result: true) { { "charge_id" => "ch_1" } }
    2.times { IdempotentJob.perform_once("ReplayCount", 1) { raise "not run" } }
    IdempotentJob.perform_once("ReplayCount", 2) { "not stored" }
    IdempotentJob.perform_once("ReplayCount", 2) { raise "not run" }
    report = IdempotentJob::Repeats.report(since:, job_type: "ReplayCount")
    expect(report.operations.to_h { |op| [op.operation_key, op.replays] }).to eq("1" => 2, "2" => 0)
    expect(report.summary.fetch("ReplayCount")).to include(replays: 2, repeats: 3)
    expect(report.lines.join("\n")).to include("2 replayed a stored result")
  end

  it "keeps what it reads in the record, so retention purges it with the record" do
    expect(IdempotentJob.repeats(since: now - 86_400, job_type: "History").size).to eq(5)
    IdempotentJob.purge(older_than: 0)
    expect(IdempotentJob.repeats(since: now - 86_400, job_type: "History")).to be_empty
  end

  it "sees the ActiveJob door's deliveries and producers alike" do
    with_adapter(:inline) do
      first = __LINE__ + 1
      AjChargeOrderJob.perform_later(4242, 100)
      AjChargeOrderJob.perform_later(4242, 100)
      AjChargeOrderJob.perform_later(4242, 100) # a third line: another producer
      op = IdempotentJob.repeats(job_type: "AjChargeOrderJob").find { |o| o.operation_key == "4242" }
      here = "spec/integration/repeats_spec.rb"
      expect(op.producers).to eq(["#{here}:#{first}", "#{here}:#{first + 1}", "#{here}:#{first + 2}"])
      expect(op.repeats.map(&:cause)).to eq(%i[re_enqueue_other_producer re_enqueue_other_producer])
      expect(op.repeats.map(&:id)).to all(match(/\A\h{8}-/))
    end
  end
end
