# frozen_string_literal: true

module IdempotentJob
  class Web
    # The read-only lists the page shows beside {IdempotentJob.held}: given-up
    # operations, a search by job type, recent takeovers, stale claims and the job types
    # present. Each list's SQL lives in the native core (`core/report.rs`) and returns
    # keys; each record is then read on its own (the core's `operations::find_listed`,
    # one round trip per row; the lists are bounded by `limit`). A record that changed
    # status between the two reads is shown as it is now; one the core cannot read is an
    # {Unreadable} row, so it does not hide the others.
    module Records
      # A listed record the core cannot read (a time edited by hand to 'infinity'): the
      # list shows its job type and key and marks `column`; its record page answers the
      # 500 naming it (`message`, the core's UnreadableRecordError).
      Unreadable = Struct.new(:job_type, :operation_key, :column, :message, keyword_init: true)

      class << self
        # @param job_type [String, nil] only this job type
        # @param limit [Integer] at most this many
        # @return [Array<Record, Unreadable>] held by the :hold policy, oldest first
        #   ({IdempotentJob.held}, but a record the core cannot read is marked, not raised)
        # @raise [ConnectionError, DatabaseError]
        def held(job_type: nil, limit: 200)
          load(IdempotentJob.store.held(job_type&.to_s, Integer(limit)))
            .select { |r| r.is_a?(Unreadable) || r.status == :held }
        end

        # @param job_type [String, nil] only this job type
        # @param limit [Integer] at most this many
        # @return [Array<Record, Unreadable>] given up by the :skip policy, newest first
        # @raise [ConnectionError, DatabaseError]
        def given_up(job_type: nil, limit: 200)
          load(IdempotentJob.store.given_up(job_type&.to_s, Integer(limit)))
        end

        # @param job_type [String] the job type (required)
        # @param key_prefix [String, nil] only operation keys starting with this text
        # @param status [String, Symbol, nil] only this status (claimed, completed,
        #   released, held, given_up)
        # @param limit [Integer]
        # @return [Array<Record, Unreadable>] most recently changed first
        # @raise [ConfigurationError] for an empty job type or an unknown status
        # @raise [ConnectionError, DatabaseError]
        def search(job_type:, key_prefix: nil, status: nil, limit: 200)
          load(IdempotentJob.store.search(job_type.to_s, key_prefix&.to_s, status&.to_s, Integer(limit)))
        end

        # @param since [Time] takeovers at or after this time
        # @param limit [Integer]
        # @return [Array<Record, Unreadable>] records whose latest claim took over an expired lease
        #   (the previous holder lost its claim), newest first; `claimed_at` is the
        #   takeover's time
        # @raise [ConnectionError, DatabaseError]
        def takeovers(since:, limit: 200)
          load(IdempotentJob.store.takeovers(since.to_f, Integer(limit)))
        end

        # @param limit [Integer]
        # @return [Array<Record, Unreadable>] claims whose lease ran out and that no delivery has
        #   taken over yet (the holder may have died), longest expired first
        # @raise [ConnectionError, DatabaseError]
        def stale_claims(limit: 200)
          load(IdempotentJob.store.stale_claims(Integer(limit)))
        end

        # @param limit [Integer]
        # @return [Array<String>] the job types that have records, in order
        # @raise [ConnectionError, DatabaseError]
        def job_types(limit: 500)
          IdempotentJob.store.job_types(Integer(limit))
        end

        # The table's metrics in Prometheus' text exposition format (the `/metrics`
        # route), one read-only statement (the core's `sql/reads.rs`: METRICS_SQL), per job type:
        # `idempotent_job_records{job_type,status}`,
        # `idempotent_job_claims{job_type,state="live"|"stale"}`,
        # `idempotent_job_oldest_held_age_seconds`, `idempotent_job_repeats_last_hour`
        # (at most 20 per operation), `idempotent_job_repeated_operations_last_hour`,
        # `idempotent_job_purge_backlog` (records a purge at `retention` would delete),
        # and `idempotent_job_retention_seconds`. Every family is a gauge.
        # @param retention [Numeric] seconds (default {Configuration#retention})
        # @return [String]
        # @raise [ConfigurationError] for a negative retention
        # @raise [ConnectionError, DatabaseError]
        def metrics(retention: IdempotentJob.configuration.retention)
          IdempotentJob.store.metrics(Float(retention))
        end

        private

        # Each listed key's record as it is now ({Unreadable} for one the core cannot read;
        # left out when gone since the list was read).
        def load(keys)
          keys.filter_map do |job_type, key|
            row = IdempotentJob.store.find_listed(job_type, key)
            next unless row
            next Record.from_row(row) unless row.key?("unreadable")

            Unreadable.new(job_type:, operation_key: key, column: row["unreadable"], message: row["error"])
          end
        end
      end
    end
  end
end
