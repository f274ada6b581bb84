# frozen_string_literal: true

require "digest/sha2" # loaded eagerly: Digest's lazy autoload is not thread-safe
require_relative "canonical_json"

module IdempotentJob
  # The digest of a job's arguments stored with each claim, to notice a later delivery
  # with the same operation key but different arguments (a payload mismatch).
  module ArgsDigest
    # @param args [Array] the job's arguments
    # @return [String] hex SHA-256 of their canonical JSON: the core's
    #   (Native.canonical_json, crates/core/src/canonical.rs), or for arguments it does not
    #   take (a Bignum, a Hash key that is not a String or Symbol) {CanonicalJson}'s,
    #   which writes the same bytes for everything else
    def self.of(args)
      ::Digest::SHA256.hexdigest(Native.canonical_json(args) || CanonicalJson.generate(args))
    end

    # The arguments' JSON as stored with a claim (`JSON.generate`) and their digest
    # ({.of}), computed from one JSON text when it is already canonical: arguments
    # that are Strings, Integers, true, false or nil (most jobs' arguments).
    # @param args [Array] the job's arguments
    # @return [Array(String, String)] the JSON text and the hex SHA-256 digest
    # @raise [JSON::GeneratorError] for a value JSON cannot write (NaN)
    def self.json_and_digest(args)
      json = JSON.generate(args)
      digest = args.all?(CanonicalJson::SCALAR) ? ::Digest::SHA256.hexdigest(json) : of(args)
      [json, digest]
    end
  end
end
