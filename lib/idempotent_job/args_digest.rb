# frozen_string_literal: true

require_relative "canonical_json"

module IdempotentJob
  # The digest of a job's arguments stored with each claim, to notice a later delivery
  # with the same operation key but different arguments (a payload mismatch). The digest
  # is the core's (crates/core/src/canonical.rs, `canonical::digest`): hex SHA-256 of the
  # canonical JSON, the same for a Python task's equal payload.
  module ArgsDigest
    # @param args [Array] the job's arguments
    # @return [String] hex SHA-256 of their canonical JSON: the core's
    #   (Native.args_digest), or for arguments it does not take (a Bignum, a Hash key
    #   that is not a String or Symbol) the core's hash of {CanonicalJson}'s text, which
    #   writes the same bytes for everything else
    def self.of(args)
      Native.args_digest(args) || Native.digest_text(CanonicalJson.generate(args))
    end

    # The arguments' JSON as stored with a claim (`JSON.generate`) and their digest
    # ({.of}). For arguments that are Strings, Integers, true, false or nil (most jobs'
    # arguments) that JSON text is already canonical: the core hashes it as it is
    # (Native.digest_text: the same bytes, about 1 µs less than canonicalising again).
    # @param args [Array] the job's arguments
    # @return [Array(String, String)] the JSON text and the hex SHA-256 digest
    # @raise [JSON::GeneratorError] for a value JSON cannot write (NaN)
    def self.json_and_digest(args)
      json = JSON.generate(args, max_nesting: Native::MAX_NESTING)
      digest = args.all?(CanonicalJson::SCALAR) ? Native.digest_text(json) : of(args)
      [json, digest]
    end
  end
end
