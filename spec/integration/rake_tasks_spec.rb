# frozen_string_literal: true

require "spec_helper"
require "fileutils"
require "open3"
require "sidekiq/api"

# The operator's rake tasks, run as a person would: `rake` in a folder with a plain
# Rakefile, against the suite's PostgreSQL and Redis.
RSpec.describe "rake idempotent_job:held and idempotent_job:resolve", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:work) { File.join(root, "tmp", "rake-tasks") }

  def rake(*args, **env)
    FileUtils.mkdir_p(work)
    File.write(File.join(work, "Rakefile"), %(require "idempotent_job/rake_tasks"\n))
    out, status = Open3.capture2e({ "RUBYLIB" => File.join(root, "lib"), **env }, "rake", *args, chdir: work)
    [out, status]
  end

  # Held as the protocol holds: by the delivery that took the stale claim over, whose claim
  # stored the job a rerun re-sends (a first claim stores none).
  def hold(job_type, key)
    delivery = { job_class: "ChargeOrderJob", queue: "default", args_json: JSON.generate([key.to_i, 100]) }
    first = claim(job_type, key, "jid-#{key}", 30, **delivery)
    RecordRows.fenced(:expire, job_type, key, first[:token], "stale")
    claimed = claim(job_type, key, "jid-#{key}", 30, **delivery)
    RecordRows.fenced(:hold, job_type, key, claimed[:token])
  end

  it "lists held operations and settles them, as done or for a rerun" do
    hold("ChargeOrderJob", "7")
    hold("ChargeOrderJob", "8")
    out, status = rake("idempotent_job:held")
    expect(status).to be_success, out
    # 2 attempts: the first claim and the takeover that held it.
    expect(out).to match(/^ChargeOrderJob\s+7\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\s+2\s+jid-7$/)
    expect(out).to include("2 held")

    out, status = rake("idempotent_job:resolve[ChargeOrderJob,7,done]")
    expect(status).to be_success, out
    expect(out).to include("resolved as done: now completed")

    Sidekiq::Testing.disable! do
      Sidekiq.redis(&:flushdb)
      out, status = rake("idempotent_job:resolve", "JOB_TYPE=ChargeOrderJob", "KEY=8", "AS=rerun",
                         "REDIS_URL" => ENV.fetch("REDIS_URL"))
      expect(status).to be_success, out
      expect(Sidekiq::Queue.new("default").map(&:args)).to eq([[8, 100]])
      Sidekiq.redis(&:flushdb)
    end
    expect(IdempotentJob.record("ChargeOrderJob", "8")).to have_attributes(status: :released, resolution: "rerun")
    expect(rake("idempotent_job:held").first).to include("no held operations")
  end

  it "fails with one line, no backtrace, for an operation with no record or one that is not held" do
    out, status = rake("idempotent_job:resolve[ChargeOrderJob,404,done]")
    expect(status).not_to be_success
    expect(out).to eq(%(idempotent_job: no record for ChargeOrderJob operation "404": nothing to resolve\n))
    claim("ChargeOrderJob", "405", "jid-405", 30)
    out, status = rake("idempotent_job:resolve[ChargeOrderJob,405,done]")
    expect(status).not_to be_success
    expect(out).to eq(%(idempotent_job: ChargeOrderJob operation "405" is not held or given up (status: :claimed)\n))
  end

  it "fails with one line naming the argument, no backtrace, for a bad HOURS, OLDER_THAN or RESTARTS" do
    {
      ["idempotent_job:repeats[abc]"] => %(idempotent_job: HOURS must be a number of hours, got "abc"\n),
      ["idempotent_job:purge[soon]"] => %(idempotent_job: OLDER_THAN must be a number of seconds, got "soon"\n),
      ["idempotent_job:purge[-5]"] =>
        "idempotent_job: purge needs older_than >= 0 seconds and a batch of at least 1, got -5 and 1000\n",
      ["idempotent_job:repeats", { "RESTARTS" => "yesterday" }] =>
        %(idempotent_job: RESTARTS must be ISO 8601 times separated by commas, got "yesterday"\n),
      ["idempotent_job:repeats", { "RESTART_WINDOW" => "2m" }] =>
        %(idempotent_job: RESTART_WINDOW must be a number of seconds, got "2m"\n)
    }.each do |(task, env), expected|
      out, status = rake(task, **(env || {}).transform_keys(&:to_s))
      expect(status).not_to be_success
      expect(out).to eq(expected)
    end
  end
end
