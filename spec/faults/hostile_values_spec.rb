# frozen_string_literal: true

require "spec_helper"
require_relative "../support/hostile_values"

# The shared table of hostile values (conformance/hostile.json, issue 29) through the
# plain Ruby door: each value as an operation key, a payload, facts (the cases that give
# `facts`) and a result. For each: the
# process survives (a crash fails the whole run), the body runs at most once, a refusal
# is the library's error naming the job and the problem, and a result that cannot be
# stored leaves the completion standing (a repeat does not run). The table's reader:
# spec/support/hostile_values.rb.
RSpec.describe "Hostile values through the plain Ruby door (conformance/hostile.json)", :faults do
  let(:runs) { [] }

  def refusal(vector, job_type)
    yield
    nil
  rescue IdempotentJob::Error => e
    expect(e.message).to start_with(job_type)
    expect(e.message.downcase).to include(vector.fetch("problem").downcase)
    e
  end

  # Delivers `job_type`/`key` twice with `options` carrying the hostile value as `use`
  # ("payload" or "facts"): refused both times with ConfigurationError naming the job and
  # nothing recorded, or run once then completed, as the table's `use` column says.
  def delivered_with(vector, use, job_type, key, **options)
    deliver = -> { IdempotentJob.perform_once(job_type, key, **options) { runs << use } }
    return refused_twice(vector, job_type, key, deliver) if vector[use] == "refused"

    expect(deliver.call.decision).to eq(:ran)
    expect(deliver.call.decision).to eq(:completed)
    expect(runs).to eq([use])
  end

  def refused_twice(vector, job_type, key, deliver)
    2.times { expect(refusal(vector, job_type) { deliver.call }).to be_a(IdempotentJob::ConfigurationError) }
    expect(runs).to be_empty
    expect(IdempotentJob.record(job_type, key)).to be_nil
  end

  it "refuses facts holding a NUL character with ConfigurationError naming the job (jsonb cannot store it)" do
    2.times do
      expect { IdempotentJob.perform_once("HostileFacts", "f", facts: { "note" => "a\u0000b" }) { runs << :facts } }
        .to raise_error(IdempotentJob::ConfigurationError, /\AHostileFacts: the facts hold a NUL character/)
    end
    expect(runs).to be_empty
    expect(IdempotentJob.record("HostileFacts", "f")).to be_nil
  end

  HostileValues.cases.each_with_index do |vector, i|
    next unless HostileValues.native?(vector) # Python's frozenset, bytes, bytearray

    describe vector["name"] do
      let(:value) { HostileValues.value(vector) }

      it "as an operation key: #{vector["key"]}" do
        job_type = "HostileKey#{i}"
        deliver = -> { IdempotentJob.perform_once(job_type, value) { runs << :key } }
        if vector["key"] == "refused"
          2.times { expect(refusal(vector, job_type) { deliver.call }).to be_a(IdempotentJob::Error) }
          expect(runs).to be_empty
        else
          expect(deliver.call.decision).to eq(:ran)
          expect(deliver.call.decision).to eq(:completed)
          expect(runs).to eq([:key])
          expect(IdempotentJob.record(job_type, vector["key_text"]).status).to eq(:completed) if vector["key_text"]
        end
      end

      it "as a payload: #{vector["payload"]}" do
        delivered_with(vector, "payload", "HostilePayload#{i}", "p-#{i}", payload: [value])
      end

      if vector.key?("facts")
        it "as facts: #{vector["facts"]}" do
          delivered_with(vector, "facts", "HostileFacts#{i}", "f-#{i}", facts: { "v" => value })
        end
      end

      it "as a result: #{vector["result"]}" do
        job_type = "HostileResult#{i}"
        deliver = lambda {
          IdempotentJob.perform_once(job_type, "r-#{i}", store_result: true) do
            runs << :result
            value
          end
        }
        expect(deliver.call.decision).to eq(:ran)
        repeat = deliver.call
        expect(repeat.decision).to eq(:completed)
        expect(runs).to eq([:result])
        expect(repeat.result_stored?).to eq(vector["result"] == "stored")
        next unless vector["result"] == "stored"
        next expect(repeat.value.map(&:to_f)).to eq(value) if vector["replays_as_integer"]

        expect(IdempotentJob::Native.canonical_json(repeat.value)).to eq(IdempotentJob::Native.canonical_json(value))
      end
    end
  end
end
