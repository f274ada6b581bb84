# frozen_string_literal: true

# Shorthands for records in a given state ({RecordRows}: the core's own statements
# over the pg gem) and for one delivery through the public one-call API.
module StoreHelpers
  # A claim as one delivery's claim statement makes it, no body run: a fixture.
  # @return [Hash] the decision (decision, token, attempt, kind, duplicates…)
  def claim(job_type, key, jid, lease, **extra)
    RecordRows.claim({ job_type:, operation_key: key, jid:, lease: lease.to_f, **extra })
  end

  # Completes the claim `token` holds (a fixture: no result stored).
  # @return [true]
  # @raise [IdempotentJob::LostClaimError] when the claim is no longer held
  def complete(job_type, key, token)
    RecordRows.fenced(:complete, job_type, key, token)
  end

  # One delivery through IdempotentJob.perform_once, on the gem's own pool (its one
  # native call: the read-only look, the claim, the body, the completion).
  # @param lease [Numeric] seconds
  # @return [IdempotentJob::Outcome]
  def deliver_once(job_type, key, lease: 30, **options, &body)
    body ||= proc {}
    IdempotentJob.perform_once(job_type, key, lease: lease.to_f, **options, &body)
  end

  # A claim whose lease has already run out: the next delivery cannot be answered by the
  # read-only look, so the claim statement runs (and waits for a row lock held elsewhere).
  def stale_claim(job_type, key, jid = "j")
    claim(job_type, key, jid, 0.05).tap { sleep 0.1 }
  end

  def unique_key
    "k-#{rand(1 << 40)}"
  end

  # How many of the gem's statements on the server `connection` (a PG::Connection) talks
  # to match `condition` (SQL over pg_stat_activity) now.
  def gem_statements(connection, condition)
    # Inside a transaction the server would answer from the snapshot of its first read.
    connection.exec("SELECT pg_stat_clear_snapshot()")
    connection.exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idempotent_job' " \
                    "AND #{condition}").getvalue(0, 0).to_i
  end

  # Polls `count` every `every` seconds until it returns a value `done` accepts or
  # `within` seconds have passed.
  # @return [Integer] the last count
  def poll_count(count, done, within:, every:)
    give_up = Process.clock_gettime(Process::CLOCK_MONOTONIC) + within
    sleep every until done.call(count.call) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > give_up
    count.call
  end

  # The gem's statements still running on the server `connection` (a PG::Connection)
  # talks to, once an interrupted call's cancel request (sent from the background, on
  # a connection of its own) has had up to `within` seconds to arrive.
  # @return [Integer] 0 when every statement ended
  def gem_statements_running(connection, within: 5)
    poll_count(-> { gem_statements(connection, "state = 'active'") }, :zero?.to_proc, within:, every: 0.05)
  end

  # Waits (up to `within` seconds) until `count` of the gem's statements wait on a lock
  # on the server `connection` talks to: the calls are blocked in their claim.
  # @return [Integer] how many wait when it returns
  def await_gem_statements_on_lock(connection, count, within: 30)
    poll_count(-> { gem_statements(connection, "wait_event_type = 'Lock'") }, ->(n) { n >= count },
               within:, every: 0.02)
  end

  # Holds the row lock of a record in another session, so a claim of it blocks.
  def with_row_locked(job_type, key)
    conn = PG.connect(SpecServices.database_url)
    conn.exec("BEGIN")
    conn.exec_params("SELECT 1 FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2 FOR UPDATE",
                     [job_type, key])
    yield
  ensure
    conn&.exec("ROLLBACK")
    conn&.close
  end
end

RSpec.configure { |config| config.include StoreHelpers }
