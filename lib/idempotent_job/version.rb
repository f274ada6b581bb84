# frozen_string_literal: true

module IdempotentJob
  # The gem's version, semantic versioning.
  VERSION = "0.1.0"
end
