# frozen_string_literal: true

module IdempotentJob
  # One idempotency record as stored in `idempotent_job_records` (read-only snapshot).
  # Times are Time objects from the database clock; durations are seconds.
  #
  # Members: job_type (String), operation_key (String), status (:claimed, :completed,
  # :released), claim_token (String, the fencing token of the last claim), attempts
  # (Integer, claims made), takeovers (Integer, claims taken from an expired lease),
  # last_claim (:first, :retry, :takeover), jid (String, last claiming job id),
  # duplicates (Integer, deliveries turned away), lease_seconds (Float),
  # lease_expired (Boolean, by the database clock), last_error (String, why the last
  # claim was released), first_claimed_at, claimed_at, lease_expires_at, completed_at,
  # released_at, last_duplicate_at, updated_at.
  Record = Struct.new(
    :job_type, :operation_key, :status, :claim_token, :attempts, :takeovers, :last_claim, :jid,
    :duplicates, :lease_seconds, :lease_expired, :last_error, :first_claimed_at, :claimed_at,
    :lease_expires_at, :completed_at, :released_at, :last_duplicate_at, :updated_at,
    keyword_init: true
  ) do
    # @return [Boolean] whether the operation's effect is recorded as done
    def completed?
      status == :completed
    end
  end
end
