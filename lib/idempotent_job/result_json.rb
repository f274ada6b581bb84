# frozen_string_literal: true

require "json"

module IdempotentJob
  # The JSON text of a body's return value for `store_result` (stored by the core's
  # completion): strictly JSON values, so that a replay gives back what was
  # returned (as JSON reads it: String keys, Symbols as Strings). Anything else is not
  # encoded, and the reason goes to the core, which words the warning
  # (the core's `results::prepare`); the completion stands either way.
  module ResultJson
    # What a stored result may contain, for the reason text.
    ALLOWED = "Hash (String or Symbol keys), Array, String, Symbol, Integer, finite Float, true, false or nil"

    # @param value [Object] the body's return value
    # @return [Array(String, nil), Array(nil, String)] `[json, nil]`, or `[nil, reason]`
    #   when the value is not a JSON value (the reason names the first offending part)
    #   or nests Arrays and Hashes deeper than the core's Native::MAX_NESTING (checked
    #   first, without recursion, so no depth can exhaust the stack)
    def self.encode(value)
      return [nil, Native::TOO_DEEP] if Native.nested_too_deep?(value)

      reason = offence(value, "$")
      return [nil, reason] if reason

      [JSON.generate(value, max_nesting: Native::MAX_NESTING), nil]
    rescue JSON::GeneratorError, JSON::NestingError, EncodingError => e
      [nil, "#{e.class}: #{e.message}"]
    end

    # The first part of `value` that is not JSON, described with its path, or nil.
    def self.offence(value, path)
      case value
      when nil, true, false, Symbol then nil
      when Integer then integer_offence(value, path)
      when String then value.valid_encoding? ? nil : "the String at #{path} is not valid #{value.encoding}"
      when Float then value.finite? ? nil : "the Float #{value} at #{path} is not finite"
      when Array then value.each_with_index.lazy.filter_map { |v, i| offence(v, "#{path}[#{i}]") }.first
      when Hash then hash_offence(value, path)
      else "a #{value.class} at #{path} is not a JSON value (a stored result is a #{ALLOWED})"
      end
    end

    # An Integer wider than every language reads back (the core's MAX_INTEGER_DIGITS:
    # Python's int_max_str_digits), described, or nil.
    def self.integer_offence(value, path)
      return nil if value.bit_length < 64 || value.abs.to_s.size <= Native::MAX_INTEGER_DIGITS

      "the Integer at #{path} has more than #{Native::MAX_INTEGER_DIGITS} digits"
    end

    def self.hash_offence(hash, path)
      hash.each do |key, v|
        unless key.is_a?(String) || key.is_a?(Symbol)
          return "the Hash at #{path} has a #{key.class} key #{key.inspect} (JSON keys are Strings)"
        end

        found = offence(v, "#{path}[#{key.to_s.inspect}]")
        return found if found
      end
      nil
    end
    private_class_method :offence, :integer_offence, :hash_offence
  end
end
