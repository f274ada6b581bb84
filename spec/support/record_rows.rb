# frozen_string_literal: true

require "idempotent_job"
require "pg"

# Records in a given state for specs, for the states the public one-call API
# (IdempotentJob.perform_once) cannot make quickly: a claim as one delivery's claim
# statement makes it, and a fenced change (:complete, :release, :hold, :give_up,
# :expire) of that claim. Written over the pg gem with the core's own statement texts
# and the gem's one parameter mapping: the ActiveRecord channel's `claim_row` and
# `fenced_raw` (IdempotentJob.claim_sql, Native.fenced_sql, Native.decide), each in a
# transaction of its own, on the database the gem is configured for.
module RecordRows
  # What the ActiveRecord channel needs of a connection: its PG::Connection.
  Connection = Struct.new(:raw_connection) do
    # @return [false] each statement is committed at once
    def transaction_open? = false
  end

  @connections = {}
  @lock = Mutex.new

  module_function

  # A connection to the gem's configured database, for this process and thread.
  # @return [PG::Connection]
  def connection
    url = IdempotentJob.configuration.database_url
    key = [Process.pid, Thread.current.object_id, url]
    @lock.synchronize do
      known = @connections[key]
      next known if known && !known.finished? && known.status == PG::CONNECTION_OK

      @connections[key] = PG.connect(url).tap { |c| c.exec("SET client_min_messages = warning") }
    end
  end

  # @param request [Hash] job_type, operation_key, jid, lease (seconds), and optionally
  #   job_class, queue, args_json, args_digest, facts_json, refuse_mismatch
  # @return [Hash] the decision (as `Native.decide` answers: decision, token, attempt,
  #   kind, duplicates…); a repeat's facts are queued for the bookkeeping
  def claim(request)
    pg = connection
    session = IdempotentJob::Transactional::ActiveRecord.new(Connection.new(pg))
    row, token = pg.transaction { session.claim_row(request, 5) }
    IdempotentJob.store.record_repeat(row, token, request, row[:decided_at])
    IdempotentJob::Native.decide(row, token, request)
  end

  # @param change [Symbol] :complete, :release, :hold, :give_up or :expire
  # @param text [String, nil] the error text of :release / :expire
  # @return [true]
  # @raise [IdempotentJob::LostClaimError] when the claim is no longer held
  def fenced(change, job_type, operation_key, token, text = nil)
    pg = connection
    session = IdempotentJob::Transactional::ActiveRecord.new(Connection.new(pg))
    pg.transaction { session.fenced_raw(change, job_type, operation_key, token, text) }
  end
end
