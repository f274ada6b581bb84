# frozen_string_literal: true

require "json"

module IdempotentJob
  # The one canonical JSON of the gem, shared by operation keys ({Key}) and payload
  # digests ({ArgsDigest}): Hash keys as Strings, sorted; Symbols as Strings; an
  # integral finite Float as its Integer (`1.0` is `1`: JSON producers in other
  # languages do not tell them apart); everything else as JSON writes it.
  module CanonicalJson
    # Values whose JSON is already canonical (`SCALAR === value`).
    SCALAR = ->(value) { value.is_a?(String) || value.is_a?(Integer) || value == true || value == false || value.nil? }

    # @param value [Object] JSON-like data
    # @yieldparam unsupported [Object] a value JSON cannot carry faithfully (a non-finite
    #   Float, any other object); the block's value replaces it (it may raise). Without
    #   a block such values are left to JSON.
    # @return [Object] the canonical form (Hashes, Arrays, Strings, Integers, Floats, true, false, nil)
    def self.normalize(value, &unsupported)
      case value
      when Hash then value.map { |k, v| [k.to_s, normalize(v, &unsupported)] }.sort_by(&:first).to_h
      when Array then value.map { |v| normalize(v, &unsupported) }
      when Symbol then value.to_s
      when Float then float(value, &unsupported)
      when String, Integer, true, false, nil then value
      else unsupported ? yield(value) : value
      end
    end

    # @param value [Object] JSON-like data
    # @return [String] its canonical JSON text
    # @raise [JSON::GeneratorError] for a value JSON cannot write (NaN)
    def self.generate(value, &)
      JSON.generate(normalize(value, &), max_nesting: Native::MAX_NESTING)
    end

    def self.float(value)
      return value.to_i if value.finite? && value == value.truncate
      return value if value.finite? || !block_given?

      yield(value)
    end
    private_class_method :float
  end
end
