# frozen_string_literal: true

require "spec_helper"
require "open3"

# Retention: finished records go in bounded batches; nothing else is ever purged.
RSpec.describe "Purging finished records", :integration do
  def fixture!
    Effects.connection.exec(<<~SQL)
      INSERT INTO idempotent_job_records
        (job_type, operation_key, status, claim_token, lease_seconds, lease_expires_at,
         first_claimed_at, claimed_at, completed_at, given_up_at, held_at)
      SELECT 'Purge', 'k' || i,
             (ARRAY['completed', 'completed', 'given_up', 'held', 'claimed', 'released'])[i % 6 + 1],
             gen_random_uuid(), 30, now() - interval '1 day', now() - interval '2 days', now() - interval '2 days',
             CASE WHEN i % 6 IN (0, 1) THEN now() - (CASE WHEN i % 12 < 6 THEN interval '2 days'
                                                         ELSE interval '1 minute' END) END,
             CASE WHEN i % 6 = 2 THEN now() - interval '2 days' END,
             CASE WHEN i % 6 = 3 THEN now() - interval '2 days' END
        FROM generate_series(1, 200000) AS i
    SQL
  end

  def counts
    Effects.connection.exec("SELECT status, count(*) FROM idempotent_job_records WHERE job_type = 'Purge' " \
                            "GROUP BY status").to_h { |r| [r["status"], r["count"].to_i] }
  end

  it "deletes only completed and given-up records older than the retention, in batches, while claims go on" do
    fixture!
    before = counts
    latencies = []
    stop = false
    claimer = Thread.new do
      i = 0
      until stop
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        claim("PurgeNeighbour", "n#{i += 1}", "j", 30)
        latencies << (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      end
    end
    progress = []
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    begin
      total = IdempotentJob.purge(older_than: 3600, batch_size: 5000) { |so_far| progress << so_far }
    ensure
      # Also when the purge raised: a claimer left running would go on into later examples.
      stop = true
      claimer.join
    end
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    after = counts

    old_completed = before["completed"] / 2 # i % 12 < 6: finished two days ago
    expect(total).to eq(old_completed + before["given_up"])
    expect(after["completed"]).to eq(before["completed"] - old_completed)
    expect(after.values_at("given_up", "held", "claimed", "released"))
      .to eq([nil, before["held"], before["claimed"], before["released"]])
    expect(progress.size).to be >= (total / 5000)
    expect(progress.last).to eq(total)
    sorted = latencies.sort
    puts "\n    purge: #{total} of 200000 records in #{elapsed.round(2)} s, #{progress.size} batches; " \
         "concurrent claims: #{latencies.size}, median #{(sorted[sorted.size / 2] * 1000).round(2)} ms, " \
         "p99 #{(sorted[(sorted.size * 0.99).floor] * 1000).round(2)} ms, max #{(sorted.last * 1000).round(2)} ms"
  end

  it "is a rake task that prints a final count" do
    root = File.expand_path("../..", __dir__)
    dir = File.join(root, "tmp", "rake-purge")
    FileUtils.mkdir_p(dir)
    File.write(File.join(dir, "Rakefile"), %(require "idempotent_job/rake_tasks"\n))
    done = claim("PurgeRake", "1", "j", 30)
    complete("PurgeRake", "1", done[:token])
    out, status = Open3.capture2e({ "RUBYLIB" => File.join(root, "lib") }, "rake", "idempotent_job:purge[0]",
                                  chdir: dir)
    expect(status).to be_success, out
    expect(out).to match(/purged \d+ records finished more than 0.0 s ago/)
    expect(IdempotentJob.record("PurgeRake", "1")).to be_nil
  end
end
