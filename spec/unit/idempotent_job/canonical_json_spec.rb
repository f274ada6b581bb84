# frozen_string_literal: true

require "spec_helper"

RSpec.describe IdempotentJob::CanonicalJson do
  it "writes Hash keys as sorted Strings, Symbols as Strings and integral Floats as Integers" do
    expect(described_class.generate({ b: 1.0, "a" => [:x, 2.5, { z: nil, y: true }] }))
      .to eq('{"a":["x",2.5,{"y":true,"z":null}],"b":1}')
  end

  it "gives the operation key and the payload digest the same rule: 1 and 1.0 are one value" do
    key = IdempotentJob::Key.new(ChargeOrderJob, 0)
    expect(key.operation_key([{ "id" => 1.0 }])).to eq(key.operation_key([{ "id" => 1 }]))
    expect(IdempotentJob::ArgsDigest.of([1, { "n" => 1.0 }])).to eq(IdempotentJob::ArgsDigest.of([1.0, { n: 1 }]))
    expect(IdempotentJob::ArgsDigest.of([1.5])).not_to eq(IdempotentJob::ArgsDigest.of([1]))
  end

  it "no payload mismatch is reported for the same operation delivered with 1 and 1.0" do
    mismatches = []
    handle = IdempotentJob.subscribe(:mismatch) { |_, payload| mismatches << payload }
    IdempotentJob.perform_once("CanonicalCharge", 7, payload: [7, 100]) { nil }
    IdempotentJob.perform_once("CanonicalCharge", 7, payload: [7, 100.0]) { nil }
    expect(mismatches).to be_empty
  ensure
    IdempotentJob.unsubscribe(handle)
  end

  it "hands other values to a block (the key's refusal) or leaves them to JSON" do
    expect(described_class.normalize([Float::NAN]) { |v| "bad #{v}" }).to eq(["bad NaN"])
    expect(described_class.normalize([Object], &:name)).to eq(["Object"])
  end
end
