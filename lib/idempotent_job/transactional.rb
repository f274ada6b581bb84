# frozen_string_literal: true

module IdempotentJob
  # Where the {Protocol}'s statements for one delivery go: a strategy ({.for}) names
  # the channel of the one native call (`Native::Protocol#perform`).
  # {Direct} uses the gem's pool statement by statement (heartbeat, release on error,
  # completion retried); {Native} and {ActiveRecord} put the claim, the body's writes
  # and the completion in one transaction (`transaction: true` / `:active_record`).
  #
  # The core protocol ({Protocol::Driver}) runs a delivery's steps over the session:
  # the pool's (Direct), the gem's transaction (Native: `Native::Transaction`), or
  # ActiveRecord's (its statements sent on ActiveRecord's connection: `claim_row`,
  # `fenced_raw`).
  module Transactional
    # @param flavour [Symbol, nil] {JobOptions#transaction}: nil, :native or :active_record
    # @return [Class] the strategy, answering `within { |session| … }`
    def self.for(flavour)
      case flavour
      when nil then Direct
      when :native then Native
      when :active_record then ActiveRecord
      else raise ArgumentError, "unknown transaction flavour #{flavour.inspect}"
      end
    end
  end
end

require_relative "transactional/direct"
require_relative "transactional/native"
require_relative "transactional/active_record"
