# frozen_string_literal: true

require "bigdecimal"
require "json"
require "set"

# The shared table of hostile values (conformance/hostile.json, issue 29): its cases, each
# case's value built in Ruby, and its JSON text as a producer in any language could put it
# on a queue (for a real `sidekiq` process: spec/integration/sidekiq_hostile_spec.rb).
module HostileValues
  TABLE = JSON.parse(File.read(File.expand_path("../../conformance/hostile.json", __dir__)))

  module_function

  # @return [Array<Hash>] the table's cases
  def cases
    TABLE.fetch("cases")
  end

  FLOATS = { "NaN" => Float::NAN, "Infinity" => Float::INFINITY, "-Infinity" => -Float::INFINITY }.freeze
  # How each `make` of the table builds its value, from the make's argument.
  MAKERS = {
    "nest" => ->(levels) { levels.times.reduce(1) { |inner, _| [inner] } },
    "string_bytes" => ->(bytes) { "x" * bytes },
    "bytes_hex" => ->(hex) { [hex].pack("H*").force_encoding(Encoding::UTF_8) },
    "float" => ->(name) { FLOATS.fetch(name) },
    "integer_digits" => ->(digits) { (10**digits) - 1 },
    "decimal" => ->(text) { BigDecimal(text) },
    "object" => ->(_) { Object.new },
    "set" => ->(items) { Set.new(items) },
    # Ruby's bytes: a String in ASCII-8BIT (BINARY), as File.binread or pack give.
    "binary_string" => ->(hex) { [hex].pack("H*") },
    # A UTF-16 surrogate's three bytes, labelled UTF-8 (not valid UTF-8): what Ruby's
    # JSON parser makes of a lone "\udc00" escape.
    "lone_surrogate" => ->(hex) { surrogate(hex) },
    "lone_surrogate_key" => ->(hex) { { surrogate(hex) => 1 } },
    "map_key" => ->(kind) { { MAP_KEYS.fetch(kind) => "v" } },
    "colliding_keys" => ->(kind) { { (kind == "symbol" ? :a : 1) => "a", (kind == "symbol" ? "a" : "1") => "b" } }
  }.freeze
  # The map keys of the table's `map_key` cases, as Ruby writes them.
  MAP_KEYS = { "integer" => 1, "symbol" => :a, "float" => 1.5, "list" => [1, 2], "null" => nil,
               "boolean" => true }.freeze

  # A lone UTF-16 surrogate (hex code point) as its three bytes, labelled UTF-8.
  def surrogate(hex)
    point = hex.to_i(16)
    [0xE0 | (point >> 12), 0x80 | ((point >> 6) & 0x3F), 0x80 | (point & 0x3F)].pack("C*")
                                                                               .force_encoding(Encoding::UTF_8)
  end

  # Whether Ruby has the case's value (Python's frozenset, bytes and bytearray are not
  # Ruby values; a Ruby binary String is Ruby's bytes).
  def native?(vector)
    return true if vector.key?("json")

    MAKERS.key?(vector.fetch("make").keys.first)
  end

  # The case's value, built as the table says (see its "about").
  def value(vector)
    return JSON.parse(vector["json"]) if vector.key?("json")

    name, argument = vector.fetch("make").first
    MAKERS.fetch(name).call(argument)
  end

  # The case's value as JSON text a producer in another language could send (NaN and
  # Infinity as those tokens, bytes as they are), or nil when JSON has no form for it
  # (a decimal or an object exist only inside a language).
  def raw_json(vector)
    return vector["json"] if vector.key?("json")

    name, argument = vector.fetch("make").first
    case name
    when "nest" then "#{"[" * argument}1#{"]" * argument}"
    when "string_bytes", "bytes_hex" then "\"#{value(vector)}\"".b
    when "float" then argument
    when "integer_digits" then "9" * argument
    when "lone_surrogate" then %("\\u#{argument}")
    when "lone_surrogate_key" then %({"\\u#{argument}":1})
    end
  end
end

# The job a real `sidekiq` process runs for the table: `key` is the operation key,
# `payload` rides along, and the body returns the value of the case named `result_case`
# (built in the worker), or "done". No retries: a delivery the library refuses goes
# straight to Sidekiq's dead set (its dead-letter convention), never acknowledged silently.
class HostileSidekiqJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: 1, idempotency_store_result: true, retry: 0

  def perform(tag, _key, _payload, result_case)
    Effects.record("hostile", tag)
    return "done" unless result_case

    HostileValues.value(HostileValues.cases.find { |c| c["name"] == result_case })
  end
end
