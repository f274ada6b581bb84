# frozen_string_literal: true

require "spec_helper"
require "json"
require "pg"

# The conformance vectors (conformance/vectors.json, docs/conformance.md) through the Ruby
# door: its canonical JSON and digests, its operation keys and refusals, its delays, and
# every decision case delivered by IdempotentJob.perform_once on the suite's PostgreSQL.
# The Python tests and the core's cargo tests read the same file: a door that drifts fails.
RSpec.describe "the conformance vectors (Ruby door)" do
  vectors = JSON.parse(File.read(File.expand_path("../../conformance/vectors.json", __dir__)))
  cases = ->(section) { vectors.fetch(section).fetch("cases") }

  it "reads a vectors format it knows" do
    expect(vectors["format"]).to eq(1)
  end

  describe "canonical JSON and digests" do
    cases.call("canonical").each do |c|
      it c["name"] do
        value = JSON.parse(c["json"])
        expect([IdempotentJob::Native.canonical_json(value), IdempotentJob::ArgsDigest.of(value)])
          .to eq([c["canonical"], c["digest"]])
      end
    end
  end

  # The operation key's text, or the refusal's message.
  def key_result
    [:text, yield]
  rescue IdempotentJob::OperationKeyError => e
    [:refused, e.message]
  end

  def check_key(vector, result)
    if vector.key?("text")
      expect(result).to eq([:text, vector["text"]])
    else
      expect(result.first).to eq(:refused)
      expect(result.last).to include(vector["refused"])
    end
  end

  describe "operation keys" do
    cases.call("keys").each do |c|
      it c["name"] do
        job = c.fetch("job_type", "Job")
        check_key(c, key_result do
          IdempotentJob::Key.check!(job, IdempotentJob::Key.value_key(JSON.parse(c["json"]), job), job_name: job)
        end)
      end
    end

    cases.call("composite_keys").each do |c|
      it "composite: #{c["name"]}" do
        parts = JSON.parse(c["parts_json"])
        check_key(c, key_result do
          IdempotentJob::Key.check!("Job", IdempotentJob::Key.new("Job", (0...parts.size).to_a).operation_key(parts),
                                    job_name: "Job")
        end)
      end
    end
  end

  describe "key paths" do
    cases.call("key_paths").each do |c|
      it "key path: #{c["name"]}" do
        key = IdempotentJob::Key.new("Job", c["declaration"])
        check_key(c, key_result do
          IdempotentJob::Key.check!("Job", key.operation_key(JSON.parse(c["args_json"])), job_name: "Job")
        end)
      end
    end
  end

  describe "delays" do
    it "defers as the vectors say" do
      vectors["delays"]["deferral"].each do |d|
        got = IdempotentJob::Native.deferral_delay(d["lease_remaining"].to_f, d["deferrals"], d["margin"].to_f)
        expect(got).to eq(d["delay"]), d.inspect
      end
    end
  end

  describe "decisions" do
    section = vectors.fetch("decisions")
    job = "ConformanceJob"

    def deliver(job, key, payload, options, deferrals)
      lookup = options["lookup"]
      opts = { payload:, on_stale: options["on_stale"].to_sym, on_mismatch: options["on_mismatch"].to_sym,
               heartbeat: false, deferrals: }
      asked = false
      if lookup
        opts[:lookup] = lambda { |_key|
          asked = true
          lookup.to_sym
        }
      end
      ran = false
      outcome = IdempotentJob.perform_once(job, key, **opts) { ran = true }
      { "decision" => outcome.decision.to_s, "error" => nil, "ran" => ran,
        "claim" => outcome.claim&.kind&.to_s, "lookup_asked" => asked,
        "duplicates" => outcome.duplicates, "retry_after" => outcome.retry_after }
    rescue IdempotentJob::PayloadMismatchError
      { "decision" => nil, "error" => "payload_mismatch", "ran" => ran, "claim" => nil,
        "lookup_asked" => asked, "duplicates" => nil, "retry_after" => nil }
    end

    def setup_record(section, job, key, record)
      first = IdempotentJob.perform_once(job, key, payload: section["payload_a"], heartbeat: false) { :set_up }
      expect(first.decision).to eq(:ran)
      setup = section["setup"].fetch(record)
      conn = PG.connect(SpecServices.database_url)
      changed = conn.exec_params(section["setup_sql"], [job, key, setup["status"], setup["lease_expires_in"]])
      expect(changed.cmd_tuples).to eq(1)
    ensure
      conn&.close
    end

    cases.call("decisions").each do |c|
      it c["name"] do
        key = "conformance-#{SecureRandom.uuid}"
        setup_record(section, job, key, c["record"]) unless c["record"] == "absent"
        payload = c["payload"] == "same" ? section["payload_a"] : section["payload_b"]
        got = deliver(job, key, payload, c["options"], c.fetch("deferrals", 0))
        got["status_after"] = IdempotentJob.record(job, key)&.status&.to_s
        expect(got).to eq(c["expect"])
      end
    end
  end
end
