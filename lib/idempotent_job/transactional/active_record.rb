# frozen_string_literal: true

require "securerandom"
require "time"

module IdempotentJob
  module Transactional
    # The ActiveRecord flavour (`transaction: :active_record`): the claim statement and
    # its decision come from the native core (IdempotentJob.claim_sql, Native.decide);
    # only the driver is ActiveRecord's connection, so the job's models write in the
    # same transaction. Errors of the gem's own statements are raised as the native
    # path raises them: the same classes, `sqlstate`, and LostClaimError's `job_type`
    # and `operation_key`.
    class ActiveRecord
      # Parameters of the fenced changes that store a text ($4).
      TEXT_CHANGES = %i[release expire hold].freeze

      # Runs the block in `ActiveRecord::Base.transaction`; inside a transaction the caller
      # opened, in that one as it is (no nested transaction: the distributed profile has
      # none), so an ActiveRecord::Rollback from the body reaches the caller's block and
      # rolls it back, claim included. A repeat the claim met (a duplicate, a retry, a
      # takeover) is queued for the asynchronous repeat bookkeeping
      # by the delivery's native call itself, when it ends without an error and this
      # transaction is the outermost one (not one joining an outer transaction, whose
      # rollback would undo the claim: then nothing is queued); the bookkeeping's batches
      # skip the record's row while this transaction holds it, and write its entry only
      # once this transaction committed (the entry carries the claim's transaction id: a
      # rollback after the call, e.g. a raising event subscriber or a failed COMMIT, leaves
      # no entry) (docs/design.md, "Repeat bookkeeping").
      # @yieldparam session [ActiveRecord]
      # @return [Object] the block's value
      # @raise [ConfigurationError] when ActiveRecord is not loaded
      # @raise [Error] when the block's transaction was rolled back by ActiveRecord::Rollback
      #   (inside the caller's transaction, the Rollback itself reaches the caller's block)
      def self.within
        unless defined?(::ActiveRecord::Base)
          raise ConfigurationError, "idempotency_transaction: :active_record needs ActiveRecord loaded"
        end

        finished = false
        result = with_connection do |connection|
          outermost = !connection.transaction_open?
          # Joined, a `transaction` block would swallow an ActiveRecord::Rollback and roll
          # back nothing: the claim would commit with the caller's transaction, left claimed.
          # A proc, not a lambda: Rails 7.2's `transaction` yields the transaction object.
          run = proc do
            value = yield new(connection, outermost:)
            finished = true
            value
          end
          outermost ? connection.transaction(&run) : run.call
        end
        unless finished
          raise Error, "the idempotent transaction was rolled back (ActiveRecord::Rollback): nothing was " \
                       "recorded, the delivery fails so it is retried"
        end
        result
      end

      # Yields ActiveRecord's connection for this thread, the one its models use meanwhile:
      # Rails 7.2+'s `with_connection` (7.2 warns about, or refuses, `Base.connection` under
      # `permanent_connection_checkout`), `Base.connection` before it.
      # @yieldparam connection [ActiveRecord::ConnectionAdapters::AbstractAdapter]
      # @return [Object] the block's value
      def self.with_connection(&)
        return ::ActiveRecord::Base.with_connection(&) if ::ActiveRecord::Base.respond_to?(:with_connection)

        yield ::ActiveRecord::Base.connection
      end

      # The core's statement texts this session sends, asked of the extension once each
      # (`:claim`, `[:fenced, change]`, `[:lock_timeout, seconds]`: see `Native.claim_sql`,
      # `Native.fenced_sql`, `Native.lock_timeout_statements`).
      @statements = {}

      # @param which [Symbol, Array] see above
      # @return [String, Array] the statement text (for :lock_timeout, the
      #   `[set_sql, param, reset_sql]` triple)
      def self.statements(which)
        @statements[which] ||= case which
                               in :claim then IdempotentJob.claim_sql
                               in [:fenced, change] then IdempotentJob::Native.fenced_sql(change)
                               in [:lock_timeout, seconds] then IdempotentJob::Native.lock_timeout_statements(seconds)
                               end.freeze
      end

      # @param connection [ActiveRecord::ConnectionAdapters::PostgreSQLAdapter]
      # @param outermost [Boolean] whether {.within} opened the transaction (false: it
      #   joined an outer one)
      def initialize(connection, outermost: true)
        @connection = connection
        @outermost = outermost
      end

      # Asked by the core's channel (`Native::Protocol#perform`) when the claim was a
      # repeat: whether its bookkeeping may be queued when the delivery ends (true: the
      # transaction commits right after; false: an outer transaction goes on, and may
      # roll the claim back).
      # @return [Boolean]
      def outermost? = @outermost

      # Asked by the core's channel when the body raised: whether this transaction is
      # rolled back with it, so there is no claim to release: the one {.within} opened, or
      # one no longer open and well on the server (aborted by the body's failed statement,
      # or its connection lost: PostgreSQL rolls it back). False when it joined a
      # transaction the caller opened, which commits the claim if the caller rescues the
      # error: the claim is then released in it, as a raising body's claim is.
      # @return [Boolean]
      def rolled_back_on_raise?
        @outermost || @connection.raw_connection.transaction_status != ::PG::PQTRANS_INTRANS
      end

      # Runs IdempotentJob.claim_sql on ActiveRecord's connection, inside its
      # transaction, and answers the statement's row for the core to decide on (the
      # core protocol's channel: `Native::Protocol#perform`).
      # @param request [Hash] the claim request Hash (job_type, operation_key, jid, lease…:
      #   see `claim_request` in ext/idempotent_job/src/ruby/convert.rs)
      # @param lock_timeout [Numeric] seconds
      # @return [Array(Hash, String)] the claim row's values (typed; `decided_at` in Float
      #   epoch seconds) and the token sent
      # @raise [LockTimeoutError] when another delivery held the operation past lock_timeout
      # @raise [ConnectionError, TimeoutError, DatabaseError] as the native path
      def claim_row(request, lock_timeout)
        @connection.materialize_transactions if @connection.respond_to?(:materialize_transactions)
        token = SecureRandom.uuid
        raw = @connection.raw_connection
        set_sql, param, reset_sql = self.class.statements([:lock_timeout, lock_timeout.to_f])
        row = translated(request) do
          raw.exec_params(set_sql, [param])
          raw.exec_params(self.class.statements(:claim), claim_params(request, token)).first.tap { raw.exec(reset_sql) }
        end
        [typed(row), token]
      rescue LockTimeoutError => e
        subject = "#{request[:job_type]} operation #{request[:operation_key].inspect}: "
        IdempotentJob::Native.raise_lock_timeout(request[:job_type], request[:operation_key], lock_timeout.to_f,
                                                 e.message.delete_prefix(subject))
      end

      # Applies a fenced change (the completion) on ActiveRecord's connection.
      # @param change [Symbol]
      # @param claim [Claim]
      # @param text [String, nil]
      # @param result [Array, nil] :complete's stored result (the core's prepared result:
      #   its JSON text and state are the completion's $4 and $5)
      # @return [true]
      # @raise [LostClaimError] when the claim is no longer held (with job_type, operation_key)
      def fenced(change, claim, text = nil, result = nil)
        params = [claim.job_type, claim.operation_key, claim.token]
        params << text if TEXT_CHANGES.include?(change)
        params.push(result&.[](0), result&.[](1)&.to_s) if change == :complete
        answer = translated(claim.to_h) do
          @connection.raw_connection.exec_params(self.class.statements([:fenced, change]), params)
        end
        return true if answer.cmd_tuples == 1

        raise error(LostClaimError, "cannot #{change.to_s.tr("_", " ")} #{claim.job_type} operation " \
                                    "#{claim.operation_key.inspect}: claim #{claim.token} is no longer held (its " \
                                    "lease ran out and another delivery took the operation over)",
                    job_type: claim.job_type, operation_key: claim.operation_key)
      end

      # {#fenced} for the core protocol's channel (`Native::Protocol#perform`).
      # @param change [Symbol]
      # @param job_type [String]
      # @param operation_key [String]
      # @param token [String]
      # @param text [String, nil]
      # @param result [Array, nil] :complete's stored result (`[json, state]`), nil: none
      # @return [true]
      # @raise [LostClaimError]
      # rubocop:disable Metrics/ParameterLists -- the fenced statement's parameters, as the core's channel sends them
      def fenced_raw(change, job_type, operation_key, token, text, result = nil)
        fenced(change, IdempotentJob::Claim.new(job_type:, operation_key:, token:), text, result)
      end
      # rubocop:enable Metrics/ParameterLists

      private

      # PostgreSQL's errors on the gem's statements → the exceptions the native path
      # raises for them (Native.server_error: the same class, `sqlstate` and
      # `retryable?`); an error without SQLSTATE (the connection is gone) is a
      # ConnectionError.
      def translated(subject)
        yield
      rescue PG::Error => e
        result = e.respond_to?(:result) ? e.result : nil
        sqlstate = result&.error_field(PG::PG_DIAG_SQLSTATE)
        text = result&.error_field(PG::PG_DIAG_MESSAGE_PRIMARY) || e.message.strip
        { "DETAIL" => PG::PG_DIAG_MESSAGE_DETAIL, "HINT" => PG::PG_DIAG_MESSAGE_HINT }.each do |label, field|
          value = result&.error_field(field)
          text += " #{label}: #{value}" if value
        end
        text = "#{subject[:job_type]} operation #{subject[:operation_key].inspect}: #{text}"
        raise IdempotentJob::Native.server_error(sqlstate, text)
      end

      def error(klass, message, **attributes)
        klass.new(message).tap do |e|
          attributes.each { |name, value| e.instance_variable_set(:"@#{name}", value) }
        end
      end

      # The claim statement's parameters in its numbering (the core's CLAIM_SQL: $1–$8 the
      # first-claim insert's, then queue, arguments, refuse_mismatch, returning).
      def claim_params(request, token)
        [request[:job_type], request[:operation_key], token, request[:jid], request[:lease].to_s,
         request[:args_digest], request[:job_class], request[:facts_json], request[:queue], request[:args_json],
         request[:refuse_mismatch] ? "true" : "false", request[:returning] ? "true" : "false"]
      end

      # The claim row's values (text, or typed when the connection has a result type
      # map) → the types Native.decide reads, and `xid` (text): the claiming transaction's
      # id, for which the repeat's `repeat_facts` entry waits to commit.
      def typed(row)
        { won: boolean(row["won"]), status: row["status"], last_claim: row["last_claim"],
          attempts: Integer(row["attempts"]), jid: row["jid"], duplicates: Integer(row["duplicates"]),
          mismatch: boolean(row["mismatch"]), lease_remaining: Float(row["lease_remaining"]),
          takeovers: Integer(row["takeovers"] || 0),
          result: row["result"], result_state: row["result_state"], decided_at: epoch(row["decided_at"]),
          xid: row["xid"]&.to_s }
      end

      # The claim's `decided_at` (a Time with a result type map, a text without) in
      # Float epoch seconds.
      def epoch(value)
        (value.is_a?(Time) ? value : Time.parse(value.to_s)).to_f
      end

      def boolean(value)
        [true, "t", "true"].include?(value)
      end
    end
  end
end
