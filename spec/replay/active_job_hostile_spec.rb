# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_jobs"
require_relative "../support/hostile_values"

# The protected job of the hostile-values table: argument 1 is the operation key,
# argument 2 rides along as payload; the effect names argument 0.
class AjHostileJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: 1, lease: 30

  def perform(tag, _key, _payload)
    Effects.record("AjHostileJob", tag)
  end
end

# The shared table of hostile values (conformance/hostile.json, issue 29) through the
# ActiveJob door: each case serialized by ActiveJob as an adapter enqueues it, then
# executed twice as a worker does (ActiveJob::Base.execute), as the operation key and as a
# payload. The body runs at most once; a refusal is the library's error naming the job and
# the problem (raised into the adapter's retry); a value ActiveJob itself cannot serialize
# (an object, nesting past Ruby's stack) never leaves the producer.
RSpec.describe "Hostile values through the ActiveJob door (conformance/hostile.json)" do
  # The table's answer for `use`, in ActiveJob's vocabulary: from 7.1 ActiveJob serializes
  # a BigDecimal itself (its BigDecimalSerializer writes a JSON object), so as a payload
  # the decimal reaches the core as JSON and runs; before, it passed through raw and the
  # core refuses it. The key is computed from the deserialized arguments on every version.
  def expected(vector, use)
    serialized_itself = ::ActiveJob::Arguments.serialize([BigDecimal("1.1")]).first.is_a?(Hash)
    return "runs" if use == "payload" && vector.dig("make", "decimal") && serialized_itself
    # ActiveJob's own serializer writes {a: 1, "a" => 2} as one JSON object: the keys
    # merge in the producer, and the job receives a Hash without the collision.
    return "runs" if vector.dig("make", "colliding_keys") == "symbol"

    vector[use]
  end

  HostileValues.cases.each_with_index do |vector, i|
    next unless HostileValues.native?(vector) # Python's frozenset, bytes, bytearray

    it "#{vector["name"]}: key #{vector["key"]}, payload #{vector["payload"]}" do
      value = HostileValues.value(vector)
      { "key" => ["k#{i}", value, nil], "payload" => ["p#{i}", "p-#{i}", value] }.each do |use, args|
        payload = begin
          AjHostileJob.new(*args).serialize
        rescue ActiveJob::SerializationError, SystemStackError
          next # ActiveJob cannot enqueue it: nothing was sent
        end
        refusals = 2.times.filter_map do
          ActiveJob::Base.execute(payload)
          nil
        rescue IdempotentJob::Error => e
          e
        end
        if expected(vector, use) == "refused"
          expect(refusals.size).to eq(2), "#{vector["name"]} as #{use}"
          expect(refusals.map(&:message)).to all(start_with("AjHostileJob").and(match(/#{vector["problem"]}/i)))
          expect(Effects.count(args.first)).to eq(0)
        else
          expect(refusals).to be_empty, "#{vector["name"]} as #{use}: #{refusals.map(&:message)}"
          expect(Effects.count(args.first)).to eq(1), "#{vector["name"]} as #{use}"
        end
      end
    end
  end
end
