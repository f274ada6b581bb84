# frozen_string_literal: true

require "json"
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
  # re-sends; nil when no delivery took it over), mismatches (Integer, deliveries whose
  # arguments differed), last_mismatch (Boolean), resolution ("done"/"rerun"),
  # first_claimed_at, claimed_at, lease_expires_at, completed_at, released_at,
  # last_duplicate_at, heartbeat_at, held_at, given_up_at, resolved_at, updated_at,
  # result (the stored result, parsed from its JSON; nil when none is stored) and
  # result_state (:stored, :too_large, :unencodable; nil when no store was requested).
  #
  # The members are the native layer's record columns (`Native.record_columns`, from the
  # one definition of the record in the Rust core: its SQL, its struct and its
  # conversion), with `args_json` read as `args` and `result_json` as `result`.
  # Columns read under another member name (their JSON text parsed).
  RECORD_RENAMES = { "args_json" => :args, "result_json" => :result }.freeze
  private_constant :RECORD_RENAMES
  Record = Struct.new(
    *Native.record_columns.map { |column| RECORD_RENAMES.fetch(column, column.to_sym) },
    keyword_init: true
  ) do
    # @param row [Hash] the native layer's row (arguments and result as JSON text in
    #   :args_json and :result_json)
    # @return [Record]
    def self.from_row(row)
      args_json = row.delete(:args_json)
      result_json = row.delete(:result_json)
      parse = ->(json) { json && JSON.parse(json, max_nesting: Native::MAX_NESTING) }
      new(**row, args: parse.call(args_json), result: parse.call(result_json), result_state: row[:result_state]&.to_sym)
    end

    # @return [Boolean] whether the operation's effect is recorded as done
    def completed?
      status == :completed
    end

    # Whether the record holds a stored job (a job class or arguments: what a rerun
    # re-sends, written only by a delivery that took a stale claim over). The core
    # refuses `resolve(as: :rerun)` of a record without one (`NO_STORED_JOB_SQL`).
    # @return [Boolean]
    def stored_job?
      !(job_class.nil? && args.nil?)
    end
  end
end
