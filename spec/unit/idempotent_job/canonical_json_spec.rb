# frozen_string_literal: true

require "spec_helper"
require "digest/sha2"

# The core's canonical JSON (crates/core/src/canonical.rs, for every binding) is the only
# writer of operation keys and payload digests: the gem keeps no Ruby canonical JSON, so
# the host's JSON (which writes floats differently on Ruby 3.3) never changes a key or a
# digest. The reference below states the form in Ruby terms that do not change between
# Rubies (Float#to_s, Integer#to_s), for a property test of the core's text.
RSpec.describe "Canonical JSON: written by the core, in the form the gem has always stored" do
  def reference(value)
    case value
    when Hash
      pairs = value.map { |k, v| [k.to_s, v] }.sort_by { |k, _| k.b }
      "{#{pairs.map { |k, v| "#{JSON.generate(k)}:#{reference(v)}" }.join(",")}}"
    when Array then "[#{value.map { |v| reference(v) }.join(",")}]"
    when Float then value == value.truncate ? value.to_i.to_s : value.to_s
    when Symbol then JSON.generate(value.to_s)
    else JSON.generate(value)
    end
  end

  srand(20_261_202)
  floats = [0.1, -0.5, 1.5e-7, 0.0001, 0.00001, 123_456.789, 1e15 + 0.5, 12_345_678_901_234.5, 2.0**-30,
            1.0, -0.0, 1e20, 1e23, 3.0e-300, 1.7976931348623157e308, 4.9e-324, -1.23456e-8] +
           Array.new(200) { (rand - 0.5) * (10**rand(-12..15)) }
  values = [
    nil, true, false, 0, -1, 42, (2**63) - 1, -(2**63), 2**64, -(2**64), 2**70, 10**400, "", "x", "caf\u00e9",
    "cafe\u0301", "\u0001\u001f\u007f/\u2028\b\f\n\r\t\"\\", :sym, "\u{1F600}",
    [], {}, [1, "a", nil, [true, { "k" => 1.0 }]],
    { "b" => 1, "a" => 2, "B" => 3, "é" => 4, "aa" => 5, "" => 6 },
    { b: { z: [1.0, 2.5], y: :x }, a: "1" }, { 1 => "a", 2**70 => "b" },
    { "order" => { "id" => 7, "lines" => [{ "sku" => "A", "qty" => 2.0 }] } },
    *floats, floats
  ]

  it "writes every value as the form states it (floats as Float#to_s, integral floats and Integers of any width " \
     "as their digits)" do
    values.each do |value|
      expect(IdempotentJob::Native.canonical_json(value)).to eq(reference(value)), value.inspect[0, 80]
    end
  end

  it "writes the texts every language agrees on, whatever the Ruby (not the host's JSON: json 2.7 writes 1.5e-07 " \
     "as 0.00000015)" do
    expect(IdempotentJob::Native.canonical_json([1.5e-7, 1e-5, 1e20, 1e23, -0.0, 2**64, { 1 => 2.5 }]))
      .to eq('[1.5e-07,1.0e-05,100000000000000000000,99999999999999991611392,0,18446744073709551616,{"1":2.5}]')
  end

  it "digests a payload in the core, as Ruby's Digest::SHA256 over the canonical text (ArgsDigest)" do
    payloads = [[], [42, 2.0, { "b" => 1, "a" => "x" }], ["é", "\u2028/\t\u0001", nil, true, false, 12_345],
                [{ order: { id: 7, lines: [1, 2.5, "x"] } }, 1e20, -0.0], [2**64, { 1 => "a" }]]
    payloads.each do |args|
      expected = Digest::SHA256.hexdigest(reference(args))
      expect(IdempotentJob::Native.args_digest(args)).to eq(expected)
      expect(IdempotentJob::ArgsDigest.json_and_digest(args)).to eq([reference(args), expected])
    end
    expect(IdempotentJob::Native.args_digest([42, 2.0, { "b" => 1, "a" => "x" }]))
      .to eq("0109651b06da6f4daaa49b885ed0b90f205d183ef3ee36cc81a136ae8c6efac7")
  end

  it "refuses what JSON cannot carry, naming it: NaN, infinities, a Time, a BigDecimal, a Float Hash key, " \
     "invalid UTF-8, an Integer over the digit limit" do
    require "bigdecimal"
    {
      Float::NAN => /the float NaN \(JSON has no such number\)/,
      -Float::INFINITY => /the float -inf/,
      Time.at(0) => /a Time/,
      BigDecimal("1.5") => /a BigDecimal/,
      { 1.5 => 2 } => /a map key of type Float/,
      Object.new => /it holds an Object\z/, # the article by the name's first letter (was "a Object")
      Struct.new(:x).new(1) => /it holds a #<Class:/,
      "\xFF".dup.force_encoding(Encoding::UTF_8) => /a String that is not valid UTF-8/,
      10**IdempotentJob::Native::MAX_INTEGER_DIGITS => /an integer of 4301 digits \(at most 4300\)/
    }.each do |value, problem|
      expect(IdempotentJob::Native.canonical_json([value])).to be_nil
      expect { IdempotentJob::ArgsDigest.json_and_digest([1, value]) }
        .to raise_error(IdempotentJob::ArgsDigest::Unwritable, problem)
    end
  end
end
