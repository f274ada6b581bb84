# frozen_string_literal: true

require "spec_helper"
require "open3"

# The repeats report on a fixture history with known retries, re-enqueues and restarts,
# and on real deliveries.
RSpec.describe "The repeats report", :integration do
  let(:now) { Time.at(Time.now.to_i) }
  let(:restart) { now - 600 }

  def history!(key, first_claimed_ago:, repeats_ago:, classes: ["ChargeOrderJob"], mismatches: 0)
    times = repeats_ago.map { |ago| (now - ago).utc.iso8601(6) }
    params = [key, now - first_claimed_ago, "{#{times.join(",")}}", "{#{classes.join(",")}}", mismatches]
    Effects.connection.exec_params(<<~SQL, params)
      INSERT INTO idempotent_job_records
        (job_type, operation_key, status, claim_token, lease_seconds, lease_expires_at, first_claimed_at,
         claimed_at, completed_at, repeat_times, job_classes, mismatches, duplicates)
      VALUES ('History', $1, 'completed', gen_random_uuid(), 30, now(), $2, $2, now(), $3::timestamptz[], $4::text[], $5,
              cardinality($3::timestamptz[]))
    SQL
  end

  before do
    history!("retry", first_claimed_ago: 7200, repeats_ago: [7195, 7140]) # 5 s and 60 s later
    history!("re-enqueue", first_claimed_ago: 4 * 3600, repeats_ago: [3600])    # 3 hours later
    history!("restart", first_claimed_ago: 5400, repeats_ago: [630])            # 30 s after the restart
    history!("two-producers", first_claimed_ago: 100, repeats_ago: [90], classes: %w[ChargeOrderJob ChargeOrderV2Job],
                              mismatches: 1)
    history!("old", first_claimed_ago: 9 * 86_400, repeats_ago: [8 * 86_400])   # before `since`
    history!("once", first_claimed_ago: 50, repeats_ago: [])                    # never repeated
  end

  it "classifies each repeat as a retry, a re-enqueue or a restart, and notes several producers" do
    ops = IdempotentJob.repeats(since: now - 86_400, job_type: "History", restarts: [restart])
    by_key = ops.to_h { |op| [op.operation_key, op] }
    expect(by_key.keys).to contain_exactly("retry", "re-enqueue", "restart", "two-producers")
    expect(by_key["retry"].repeats.map { |r| [r[:cause], r[:after].round] }).to eq([[:retry, 5], [:retry, 60]])
    expect(by_key["re-enqueue"].repeats.map { |r| r[:cause] }).to eq([:re_enqueue])
    expect(by_key["restart"].repeats.map { |r| r[:cause] }).to eq([:restart])
    expect(by_key["two-producers"].notes.join).to include("2 job classes", "different arguments")

    summary = IdempotentJob::Repeats.summary(ops)["History"]
    expect(summary).to include(operations: 4, repeats: 5, retry: 3, re_enqueue: 1, restart: 1, mismatched: 1,
                               several_producers: 1)
  end

  it "sees real repeated deliveries, and runs as a rake task" do
    3.times { ChargeOrderJob.perform_async(42, 1500) }
    ChargeOrderJob.drain
    op = IdempotentJob.repeats(job_type: "ChargeOrderJob").first
    expect(op).to have_attributes(operation_key: "42", duplicates: 2)
    expect(op.repeats.map { |r| r[:cause] }).to eq(%i[retry retry])

    root = File.expand_path("../..", __dir__)
    dir = File.join(root, "tmp", "rake-repeats")
    FileUtils.mkdir_p(dir)
    File.write(File.join(dir, "Rakefile"), %(require "idempotent_job/rake_tasks"\n))
    out, status = Open3.capture2e({ "RUBYLIB" => File.join(root, "lib"), "RESTARTS" => restart.utc.iso8601 },
                                  "rake", "idempotent_job:repeats[24]", chdir: dir)
    expect(status).to be_success, out
    expect(out).to include('History "restart": completed, 1 repeats (restart after')
    expect(out).to match(/History: 4 operations repeated 5 times — 3 retry, 1 re-enqueue, 1 restart/)
  end
end
