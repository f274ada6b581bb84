# frozen_string_literal: true

module IdempotentJob
  # The JSON text of a body's return value for `store_result` (stored by the core's
  # completion): strictly JSON values, so that a replay gives back what was returned
  # (as JSON reads it: String keys, Symbols and Integer Hash keys as Strings). The text
  # is written by the core (`Native.value_json`: the rules every value crossing the core
  # follows, the same as a payload's and Python's result's — issue 29), never by the
  # host's `json`. Anything else is not encoded, and the reason goes to the core, which
  # words the warning (the core's `results::prepare`); the completion stands either way.
  module ResultJson
    # @param value [Object] the body's return value
    # @return [Array(String, nil), Array(nil, String)] `[json, nil]`, or `[nil, reason]`
    #   when the value is not a JSON value (the reason names what it holds: a Set, a
    #   Float key, NaN, a String that is not UTF-8, two keys of one text) or nests Arrays
    #   and Hashes deeper than the core's Native::MAX_NESTING (refused without recursing
    #   past it, so no depth can exhaust the stack)
    def self.encode(value)
      Native.value_json(value)
    end
  end
end
