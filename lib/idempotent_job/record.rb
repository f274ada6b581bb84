# frozen_string_literal: true

require "json" # the native layer parses a record's args and result with JSON.parse
require_relative "native"

module IdempotentJob
  # One idempotency record as stored in `idempotent_job_records` (read-only snapshot).
  # Times are Time objects from the database clock; durations are seconds.
  #
  # Members: job_type (String), operation_key (String), status (:claimed, :completed,
  # :released, :held, :given_up), claim_token (String, the fencing token of the last claim), attempts
  # (Integer, claims made), takeovers (Integer, claims taken from an expired lease),
  # last_claim (:first, :retry, :takeover), jid (String, last claiming job id),
  # duplicates (Integer, deliveries turned away), lease_seconds (Float),
  # lease_expired (Boolean, by the database clock), last_error (String, why the last
  # claim was released), args_digest (String), job_class, queue (String) and args
  # (Array) of the last delivery that took the operation over (the stored job a rerun
  # re-sends; nil when no delivery took it over), stored_job (Boolean, whether the record
  # holds that job: the core's one rule, see {#stored_job?}), job_classes (Array of
  # String, every job class that delivered the operation), mismatches (Integer,
  # deliveries whose arguments differed), last_mismatch (Boolean), resolution
  # ("done"/"rerun"), first_claimed_at, claimed_at, lease_expires_at, completed_at,
  # released_at, last_duplicate_at, heartbeat_at, held_at, given_up_at, resolved_at,
  # updated_at, result (the stored result, parsed from its JSON; nil when none is stored)
  # and result_state (:stored, :too_large, :unencodable; nil when no store was requested).
  #
  # The members and their values are the native layer's record (`Native.record_fields`,
  # from the one definition of the record in the Rust core: its SQL, its struct, its
  # field names and kinds, which the Python binding's record dict has too).
  Record = Struct.new(*Native.record_fields.map(&:to_sym), keyword_init: true) do
    # @param row [Hash] the native layer's record (`Native::Store#find`, `#resolve`)
    # @return [Record]
    def self.from_row(row)
      new(**row)
    end

    # @return [Boolean] whether the operation's effect is recorded as done
    def completed?
      status == :completed
    end

    # Whether the record holds a stored job (what a rerun re-sends, written only by a
    # delivery that took a stale claim over): the core's `stored_job`, read with the
    # record by the rule the core's resolve also applies (it refuses
    # `resolve(as: :rerun)` of a record without one).
    # @return [Boolean]
    def stored_job?
      stored_job
    end
  end
end
