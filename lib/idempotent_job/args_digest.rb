# frozen_string_literal: true

require "set"

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

    # The marker key of a String no JSON writer may take as text ({.writable}).
    BYTES = "idempotent_job:bytes_base64"

    # `value` with every String a JSON writer may refuse replaced by `{BYTES => "<its
    # bytes, Base64>"}`, and such Hash keys by their `inspect` (made distinct from the
    # Hash's other keys: {.writable_hash}): what a door writes back
    # when the queue's own JSON refuses a payload (Sidekiq's dead set). Such a String is
    # one not valid in its encoding (bytes that are not UTF-8, as a parser reads another
    # language's producer), or a binary (ASCII-8BIT) one that is not ASCII-only: always
    # valid, yet json 2.6 (Ruby 3.1) refuses its high bytes when they are not UTF-8 and
    # json 3 (the Ruby 3.3 stack's) refuses them even when they are (JSON::GeneratorError).
    # @param value [Object] a payload or part of it (JSON data, as the queue parsed it)
    # @return [Object] the same shape, every String one JSON writes
    def self.writable(value)
      case value
      when String then bytes?(value) ? { BYTES => [value.b].pack("m0") } : value
      when Array then value.map { |item| writable(item) }
      when Hash then writable_hash(value)
      else value
      end
    end

    # A Hash with its keys {.writable} rewrites spelled as their `inspect`, each made
    # distinct from every key kept and every key rewritten before it by a suffix ` (2)`,
    # ` (3)`… so that no value is lost (`{"\xFF".b => 1, '"\xFF"' => 2}` keeps both).
    def self.writable_hash(hash)
      rewritten = ->(key) { key.is_a?(String) && bytes?(key) }
      taken = hash.keys.reject(&rewritten).to_set(&:to_s)
      hash.each_with_object({}) do |(key, item), out|
        key = distinct(key.b.inspect, taken) if rewritten.call(key)
        out[key] = writable(item)
      end
    end
    private_class_method :writable_hash

    # `name`, or `name (2)`, `name (3)`… the first not in `taken` (which it joins).
    def self.distinct(name, taken)
      key = name
      number = 1
      key = "#{name} (#{number += 1})" while taken.include?(key)
      taken << key
      key
    end
    private_class_method :distinct

    # @param text [String]
    # @return [Boolean] whether {.writable} rewrites `text` as its bytes
    def self.bytes?(text)
      !text.valid_encoding? || (text.encoding == Encoding::BINARY && !text.ascii_only?)
    end
    private_class_method :bytes?

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
