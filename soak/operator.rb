# frozen_string_literal: true

require "idempotent_job"

module Soak
  # What a person does about held operations once the run has drained: asks the outside
  # system (the stand-in) whether the effect happened, and settles each with
  # `IdempotentJob.resolve`: as :done when it did, as :rerun (the gem re-enqueues the
  # stored job, which then runs once) when it did not.
  class Operator
    # A held operation as the operator found and settled it.
    Resolution = Struct.new(:as, :attempts, :held_at, keyword_init: true)

    # @param stand_in [StandIn::Client]
    def initialize(stand_in)
      @stand_in = stand_in
    end

    # @return [Hash{String => Resolution}] by reference, the held operations settled
    # @raise [IdempotentJob::Error] when a record cannot be read or resolved
    def resolve_held
      IdempotentJob.held(limit: 1_000_000).to_h do |record|
        reference = Soak.reference(record.job_type, record.operation_key)
        as = @stand_in.count(reference).positive? ? :done : :rerun
        IdempotentJob.resolve(record.job_type, record.operation_key, as:)
        [reference, Resolution.new(as:, attempts: record.attempts, held_at: record.held_at.to_f)]
      end
    end
  end
end
