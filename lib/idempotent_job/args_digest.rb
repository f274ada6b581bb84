# frozen_string_literal: true

module IdempotentJob
  # The digest of a job's arguments stored with each claim, to notice a later delivery
  # with the same operation key but different arguments (a payload mismatch). The text
  # and the digest are the core's (crates/core/src/canonical.rs: `canonical::digest`,
  # hex SHA-256 of the canonical JSON), the same bytes for a Python task's equal payload
  # and on every Ruby (the host's JSON never writes a canonical text: Ruby 3.3's writes
  # floats differently from Ruby 3.1's).
  module ArgsDigest
    # Raised (inside the gem) for a value JSON cannot carry; the caller words the
    # library's error naming the job ({Protocol}: ConfigurationError).
    class Unwritable < StandardError; end

    # The marker key of a String whose bytes are not valid in its encoding ({.writable}).
    BYTES = "idempotent_job:bytes_base64"

    # `value` with every String that is not valid in its encoding (bytes that are not
    # UTF-8, which no JSON writer takes) replaced by `{BYTES => "<its bytes, Base64>"}`,
    # and Hash keys that are not valid by their `inspect`: what a door writes back when
    # the queue's own JSON refuses a payload (Sidekiq's dead set).
    # @param value [Object] a payload or part of it (JSON data, as the queue parsed it)
    # @return [Object] the same shape, every String valid
    def self.writable(value)
      case value
      when String then value.valid_encoding? ? value : { BYTES => [value.b].pack("m0") }
      when Array then value.map { |item| writable(item) }
      when Hash then value.to_h { |k, v| [k.is_a?(String) && !k.valid_encoding? ? k.b.inspect : k, writable(v)] }
      else value
      end
    end

    # @param args [Array] the job's arguments
    # @return [String] hex SHA-256 of their canonical JSON (Native.args_digest)
    # @raise [Unwritable] naming what JSON cannot carry (see {.json_and_digest})
    def self.of(args)
      json_and_digest(args).last
    end

    # The arguments' canonical JSON text as stored with a claim and its digest, both
    # written by the core (Native.payload_json): Integers of any width (up to
    # Native::MAX_INTEGER_DIGITS digits), Floats by the core's one rule (an integral
    # Float as its Integer), Hash keys that are Strings, Symbols or Integers.
    # @param args [Array] the job's arguments
    # @return [Array(String, String)] the JSON text and the hex SHA-256 digest
    # @raise [Unwritable] for a value JSON cannot carry (NaN or an infinity, a Time,
    #   a BigDecimal, a String that is not UTF-8, nesting past Native::MAX_NESTING, an
    #   Integer of more digits than Native::MAX_INTEGER_DIGITS), naming it
    def self.json_and_digest(args)
      json, digest, problem = Native.payload_json(args)
      raise Unwritable, "it holds #{problem}" if problem

      [json, digest]
    end
  end
end
