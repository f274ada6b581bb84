# frozen_string_literal: true

require "spec_helper"
require "json"
require "open3"
require "rack/auth/basic"
require "rack/mock"
require "idempotent_job/web"
require_relative "../support/web_records"

# `/metrics` of the operators' page: a scripted set of deliveries through the plain
# API, then the page's answer parsed by the Python prometheus_client parser (the
# suite's .venv) and compared with the table, behind the same authentication as the
# page (here Rack::Auth::Basic in front of the mounted app).
RSpec.describe "IdempotentJob::Web /metrics" do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:job_type) { web_job_type("MetricsJob") }
  let(:app) do
    Rack::Builder.new do
      use Rack::Auth::Basic, "ops" do |user, password|
        Rack::Utils.secure_compare(user, "ops") && Rack::Utils.secure_compare(password, "secret")
      end
      map("/idempotency") { run IdempotentJob::Web }
    end
  end

  # Each sample as [name, labels, value], by the reference parser.
  def parse(text)
    script = <<~PY
      import json, sys
      from prometheus_client.parser import text_string_to_metric_families
      out = []
      for family in text_string_to_metric_families(sys.stdin.read()):
          for s in family.samples:
              out.append([s.name, s.labels, s.value, family.type])
      print(json.dumps(out))
    PY
    out, err, status = Open3.capture3(File.join(root, ".venv/bin/python"), "-c", script, stdin_data: text)
    raise "prometheus_client could not parse /metrics: #{err}" unless status.success?

    JSON.parse(out)
  end

  def deliver(key, **options, &body)
    IdempotentJob.perform_once(job_type, key, lease: 30, **options, &body || proc {})
  end

  # The deliveries: 3 completed (one delivered twice more), 1 released after an
  # error, 1 held (by the reclaim budget, max_takeovers 0) and 1 given up after taking over
  # a stale claim, 1 live and 1 stale claim, and one completion backdated past the retention.
  def script!
    3.times { |i| deliver(i + 1) }
    2.times { expect(deliver(1).decision).to eq(:completed) }
    expect { deliver(4) { raise "boom" } }.to raise_error(RuntimeError, "boom")
    { 5 => [{ max_takeovers: 0 }, :held], 6 => [{ on_stale: :skip }, :given_up] }.each do |key, (options, decision)|
      web_stale(job_type, key.to_s)
      expect(deliver(key, **options).decision).to eq(decision)
    end
    web_claim(job_type, "7")
    web_stale(job_type, "8")
    IdempotentJob.settle_repeats
    backdate!("2")
  end

  def backdate!(key)
    pg = PG.connect(SpecServices.database_url)
    pg.exec_params("UPDATE idempotent_job_records SET completed_at = now() - interval '40 days', " \
                   "first_claimed_at = now() - interval '40 days' " \
                   "WHERE job_type = $1 AND operation_key = $2", [job_type, key])
    pg.close
  end

  # The same figures, straight from the table.
  def from_table
    pg = PG.connect(SpecServices.database_url)
    row = pg.exec_params(<<~SQL, [job_type, IdempotentJob.configuration.retention]).first
      SELECT count(*) FILTER (WHERE status = 'claimed') AS claimed,
             count(*) FILTER (WHERE status = 'completed') AS completed,
             count(*) FILTER (WHERE status = 'released') AS released,
             count(*) FILTER (WHERE status = 'held') AS held,
             count(*) FILTER (WHERE status = 'given_up') AS given_up,
             count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at > now()) AS live,
             count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at <= now()) AS stale,
             extract(epoch FROM now() - min(held_at))::float8 AS held_age,
             count(*) FILTER (WHERE status = 'held' AND last_error LIKE 'the reclaim budget is spent:%') AS budget,
             (SELECT count(*) FROM idempotent_job_records r, unnest(r.repeat_times) t
               WHERE r.job_type = $1 AND t > now() - interval '1 hour') AS repeats,
             count(*) FILTER (WHERE cardinality(repeat_times) > 0) AS repeated,
             count(*) FILTER (WHERE status IN ('completed', 'given_up')
                                AND coalesce(completed_at, given_up_at) < now() - make_interval(secs => $2))
               AS backlog
        FROM idempotent_job_records WHERE job_type = $1
    SQL
    pg.close
    row.transform_values(&:to_f)
  end

  def get(path, user: nil)
    env = user ? { "HTTP_AUTHORIZATION" => "Basic #{["#{user}:secret"].pack("m0")}" } : {}
    Rack::MockRequest.new(app).get(path, env)
  end

  it "is behind the page's authentication" do
    expect(get("/idempotency/metrics").status).to eq(401)
    expect(get("/idempotency/metrics", user: "intruder").status).to eq(401)
    expect(get("/idempotency/metrics", user: "ops").status).to eq(200)
  end

  it "answers in Prometheus' text format what the table holds, per job type" do
    script!
    response = get("/idempotency/metrics", user: "ops")
    expect(response.status).to eq(200)
    expect(response.content_type).to eq("text/plain; version=0.0.4; charset=utf-8")
    samples = parse(response.body)
    expect(samples.map(&:last).uniq).to eq(["gauge"])
    ours = samples.select { |_, labels, _| labels["job_type"] == job_type }
                  .to_h { |name, labels, value| [[name, labels.except("job_type")], Float(value)] }
    table = from_table

    expected = {
      ["idempotent_job_records", { "status" => "claimed" }] => 2.0,
      ["idempotent_job_records", { "status" => "completed" }] => 3.0,
      ["idempotent_job_records", { "status" => "released" }] => 1.0,
      ["idempotent_job_records", { "status" => "held" }] => 1.0,
      ["idempotent_job_records", { "status" => "given_up" }] => 1.0,
      ["idempotent_job_claims", { "state" => "live" }] => 1.0,
      ["idempotent_job_claims", { "state" => "stale" }] => 1.0,
      ["idempotent_job_held_by_reclaim_budget", {}] => 1.0,
      # Operation 1 delivered twice more; 5 and 6 each taken over from a dead claim.
      ["idempotent_job_repeats_last_hour", {}] => 4.0,
      ["idempotent_job_repeated_operations_last_hour", {}] => 3.0,
      ["idempotent_job_purge_backlog", {}] => 1.0
    }
    expect(ours.except(["idempotent_job_oldest_held_age_seconds", {}])).to eq(expected)
    # The same figures as the table's own counts.
    expect(expected.values).to eq(table.values_at("claimed", "completed", "released", "held", "given_up", "live",
                                                  "stale", "budget", "repeats", "repeated", "backlog"))
    held_age = ours.fetch(["idempotent_job_oldest_held_age_seconds", {}])
    expect(held_age).to be > 0
    expect(held_age).to be <= table["held_age"] # read a moment before the table's own figure
    retention = samples.find { |name, *| name == "idempotent_job_retention_seconds" }
    expect(retention[2]).to eq(IdempotentJob.configuration.retention.to_f)
  end

  it "every process answers the same: a second process's /metrics equals this one's" do
    script!
    here = parse(get("/idempotency/metrics", user: "ops").body).reject { |name, *| name.include?("held_age") }
    code = <<~RUBY
      require "stringio" # the request's body below (a Rack server gives its own)
      require "idempotent_job/web"
      IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"))
      _, _, body = IdempotentJob::Web.call("REQUEST_METHOD" => "GET", "PATH_INFO" => "/metrics", "SCRIPT_NAME" => "",
                                           "QUERY_STRING" => "", "rack.input" => StringIO.new)
      print body.join
    RUBY
    out, status = Open3.capture2(RbConfig.ruby, "-I", File.join(root, "lib"), "-e", code)
    expect(status).to be_success
    there = parse(out).reject { |name, *| name.include?("held_age") }
    expect(there.select { |_, labels, _| labels["job_type"] == job_type })
      .to eq(here.select { |_, labels, _| labels["job_type"] == job_type })
  end
end
