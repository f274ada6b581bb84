# frozen_string_literal: true

require "spec_helper"
require "digest/sha2"

# The core's canonical JSON (crates/core/src/canonical.rs, for every binding) writes
# the same bytes as the gem's Ruby CanonicalJson, which made every stored operation key
# and payload digest so far: the same value keeps its key and digest whichever computes it.
RSpec.describe "Canonical JSON: the core's against the gem's Ruby one" do
  srand(20_261_202)
  floats = [0.1, -0.5, 1.5e-7, 0.0001, 0.00001, 123_456.789, 1e15 + 0.5, 12_345_678_901_234.5, 2.0**-30,
            1.0, -0.0, 1e20, 3.0e-300, 1.7976931348623157e308, 4.9e-324, -1.23456e-8] +
           Array.new(200) { (rand - 0.5) * (10**rand(-12..15)) }
  values = [
    nil, true, false, 0, -1, 42, (2**63) - 1, -(2**63), "", "x", "caf\u00e9", "cafe\u0301",
    "\u0001\u001f\u007f/\u2028\b\f\n\r\t\"\\", :sym, "\u{1F600}",
    [], {}, [1, "a", nil, [true, { "k" => 1.0 }]],
    { "b" => 1, "a" => 2, "B" => 3, "é" => 4, "aa" => 5, "" => 6 },
    { b: { z: [1.0, 2.5], y: :x }, a: "1" },
    { "order" => { "id" => 7, "lines" => [{ "sku" => "A", "qty" => 2.0 }] } },
    *floats, floats
  ]

  values.each_with_index do |value, i|
    it "writes value #{i} (#{value.inspect[0, 60]}) byte for byte as before" do
      expect(IdempotentJob::Native.canonical_json(value)).to eq(IdempotentJob::CanonicalJson.generate(value))
    end
  end

  it "gives every payload digest as before (ArgsDigest: the core's text, the Ruby one's for the rest)" do
    (values + [[2**70, { 1 => "a" }]]).each do |value|
      args = [value, 1]
      expect(IdempotentJob::ArgsDigest.of(args))
        .to eq(Digest::SHA256.hexdigest(IdempotentJob::CanonicalJson.generate(args)))
    end
  end

  it "digests a payload in the core, as Ruby's Digest::SHA256 over the canonical text (ArgsDigest)" do
    payloads = [[], [42, 2.0, { "b" => 1, "a" => "x" }], ["é", "\u2028/\t\u0001", nil, true, false, 12_345],
                [{ order: { id: 7, lines: [1, 2.5, "x"] } }, 1e20, -0.0]]
    payloads.each do |args|
      expected = Digest::SHA256.hexdigest(IdempotentJob::CanonicalJson.generate(args))
      expect(IdempotentJob::Native.args_digest(args)).to eq(expected)
      expect(IdempotentJob::ArgsDigest.json_and_digest(args)).to eq([JSON.generate(args), expected])
    end
    expect(IdempotentJob::Native.args_digest([42, 2.0, { "b" => 1, "a" => "x" }]))
      .to eq("0109651b06da6f4daaa49b885ed0b90f205d183ef3ee36cc81a136ae8c6efac7")
  end

  it "leaves what JSON cannot carry to the caller (nil): a Time, NaN, a Bignum, an Integer Hash key, invalid UTF-8" do
    [Time.now, Float::NAN, 2**70, { 1 => 2 }, "\xFF".dup.force_encoding(Encoding::UTF_8)].each do |value|
      expect(IdempotentJob::Native.canonical_json(value)).to be_nil
    end
  end
end
