# frozen_string_literal: true

require "spec_helper"

# Issue 29: values nested far deeper than any stack allows. The core's limit
# (Native::MAX_NESTING, 127 levels of Arrays and Hashes: the deepest serde_json reads) holds
# for keys, payloads, facts and results alike, judged without recursion: a key, payload or
# facts over it is refused with the library's error before anything is claimed; a result
# over it is recorded as not storable, the completion stands and a repeat does not run.
RSpec.describe "values nested deeper than the core's limit" do
  def nested(levels) = (1..levels).reduce(1) { |value, _| [value] }

  def perform(key, **options, &body)
    IdempotentJob.perform_once("NestedJob", key, lease: 30, **options, &(body || proc {
                                                                           Effects.record("nested", key)
                                                                         }))
  end

  it "states the limit once, in the core" do
    expect(IdempotentJob::Native::MAX_NESTING).to eq(127)
    expect(IdempotentJob::Native.nested_too_deep?(nested(127))).to be(false)
    expect(IdempotentJob::Native.nested_too_deep?(nested(128))).to be(true)
    expect(IdempotentJob::Native.nested_too_deep?({ "a" => [{ "b" => nested(126) }] })).to be(true)
  end

  it "completes an operation whose result is nested 100,000 deep, records it as not storable and never runs it again" do
    runs = 0
    first = perform("deep-result", store_result: true) { (runs += 1) && nested(100_000) }
    expect(first).to have_attributes(decision: :ran, result_state: :unencodable)
    again = perform("deep-result", store_result: true) { runs += 1 }
    expect(again).to have_attributes(decision: :completed, value: nil)
    expect(runs).to eq(1)
    expect(IdempotentJob.record("NestedJob", "deep-result")).to have_attributes(status: :completed,
                                                                                result_state: :unencodable)
  end

  it "stores and replays a result nested exactly to the limit" do
    perform("limit-result", store_result: true) { nested(127) }
    again = perform("limit-result", store_result: true) { raise "not run" }
    expect(again).to have_attributes(decision: :completed, replayed?: true, value: nested(127))
  end

  {
    "payload" => [->(v) { { payload: v } }, IdempotentJob::ConfigurationError, /NestedJob: the payload cannot be/],
    "facts" => [->(v) { { facts: { "x" => v } } }, IdempotentJob::ConfigurationError, /NestedJob: the facts cannot be/]
  }.each do |what, (options, error, message)|
    it "refuses a #{what} nested 100,000 deep with the library's error naming the job; nothing runs or is recorded" do
      expect { perform("deep-#{what}", **options.call(nested(100_000))) }
        .to raise_error(error, message) { |e| expect(e.message).to include("127 levels") }
      expect(Effects.count("deep-#{what}")).to eq(0)
      expect(IdempotentJob.record("NestedJob", "deep-#{what}")).to be_nil
    end
  end

  it "takes a payload of 127 levels as Python does, and refuses 128" do
    expect(perform("p127", payload: nested(127))).to have_attributes(decision: :ran)
    expect { perform("p128", payload: nested(128)) }.to raise_error(IdempotentJob::ConfigurationError, /127 levels/)
  end

  it "refuses an operation key nested 100,000 deep with OperationKeyError naming the job; nothing runs" do
    expect { perform(nested(100_000)) { raise "not run" } }
      .to raise_error(IdempotentJob::OperationKeyError, /NestedJob: operation key: a value nested deeper than 127/)
  end
end
