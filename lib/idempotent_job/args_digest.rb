# frozen_string_literal: true

require "digest/sha2" # loaded eagerly: Digest's lazy autoload is not thread-safe
require_relative "canonical_json"

module IdempotentJob
  # The digest of a job's arguments stored with each claim, to notice a later delivery
  # with the same operation key but different arguments (a payload mismatch).
  module ArgsDigest
    # @param args [Array] the job's arguments
    # @return [String] hex SHA-256 of their {CanonicalJson} (the same rules as operation keys)
    def self.of(args)
      ::Digest::SHA256.hexdigest(CanonicalJson.generate(args))
    end
  end
end
