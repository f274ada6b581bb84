# frozen_string_literal: true

require "json"
require "securerandom"

module IdempotentJob
  # The job's handle on its idempotent transaction (`idempotency_transaction: true`):
  # the claim, these statements and the completion commit together or not at all.
  # Reach it inside `perform` as `idempotent_transaction` (or
  # {IdempotentJob.current_transaction}).
  #
  #   def perform(order_id, amount_cents)
  #     idempotent_transaction.exec("INSERT INTO charges (order_id, amount_cents) VALUES ($1, $2)",
  #                                 [order_id, amount_cents])
  #   end
  #
  # Placeholders are `$1`, `$2`…, bound only as parameters (never interpolated). A
  # parameter is converted to the type PostgreSQL infers for its placeholder: nil,
  # true/false, Integer, Float, String (binary Strings for bytea), Symbol, Time, Date,
  # BigDecimal (sent as text: cast the placeholder, `$1::numeric`), Hash and Array (as
  # JSON for json/jsonb). Columns come back typed: Integer, Float, String, true/false,
  # Time (timestamptz/timestamp), Date, parsed JSON, binary String (bytea), nil; other
  # column types (numeric…) must be cast in SQL (`total::text`).
  class Transaction
    # @param native [IdempotentJob::Native::Transaction]
    def initialize(native)
      @native = native
    end

    # Runs a statement inside the transaction.
    # @param sql [String] one statement with `$n` placeholders
    # @param params [Array] bind parameters, in placeholder order
    # @return [Integer] rows affected
    # @raise [DatabaseError] PostgreSQL's error (the transaction is then rolled back
    #   when the job ends); [ArgumentError] for a parameter that cannot be bound
    def exec(sql, params = [])
      @native.exec(String(sql), Array(params))
    end

    # Runs a query inside the transaction.
    # @param sql [String] one statement with `$n` placeholders
    # @param params [Array] bind parameters, in placeholder order
    # @return [Array<Hash{String => Object}>] one Hash per row, column name → typed value
    # @raise [DatabaseError, ArgumentError] as {#exec}
    def query(sql, params = [])
      @native.query(String(sql), Array(params))
    end
  end

  # How the middleware runs a transactional delivery: claim, body and completion in
  # one transaction, on a pooled native connection or on ActiveRecord's. Internal.
  module Transactional
    # The native flavour (`idempotency_transaction: true`).
    class Native
      # @return [IdempotentJob::Transaction] the handle the job body writes through
      attr_reader :handle

      # Opens a transaction, yields the flavour, commits when the block returns and
      # rolls back when it raises.
      # @yieldparam flavour [Native]
      # @return [Object] the block's value
      def self.within
        native = IdempotentJob.store.transaction
        result = yield new(native)
        native.commit
        result
      ensure
        # Not committed (an exception, Thread#kill, throw): roll back now rather than
        # leave the transaction open, holding the operation's row, until GC.
        if native&.open?
          begin
            native.rollback
          rescue IdempotentJob::Error
            nil # the connection is closed instead; PostgreSQL rolls back
          end
        end
      end

      def initialize(native)
        @native = native
        @handle = IdempotentJob::Transaction.new(native)
      end

      # @return [Hash] the decision (see Native::Store#claim)
      def claim(request, lock_timeout)
        @native.claim(request, lock_timeout.to_f)
      end

      # Applies a fenced change inside the transaction.
      def fenced(change, job_type, operation_key, token, text)
        @native.fenced(change, job_type, operation_key, token, text)
      end
    end

    # The ActiveRecord flavour (`idempotency_transaction: :active_record`): the claim
    # statement and its decision come from the native core (IdempotentJob.claim_sql,
    # Native.decide); only the driver is ActiveRecord's connection, so the job's
    # models write in the same transaction.
    class ActiveRecord
      # Parameters of the fenced changes that store a text ($4).
      TEXT_CHANGES = %i[release expire].freeze

      # @return [nil] the body uses its models
      def handle = nil

      # Runs the block in `ActiveRecord::Base.transaction`.
      # @raise [ConfigurationError] when ActiveRecord is not loaded
      # @raise [Error] when the block's transaction was rolled back by ActiveRecord::Rollback
      def self.within
        unless defined?(::ActiveRecord::Base)
          raise ConfigurationError, "idempotency_transaction: :active_record needs ActiveRecord loaded"
        end

        finished = false
        result = ::ActiveRecord::Base.transaction do
          value = yield new(::ActiveRecord::Base.connection)
          finished = true
          value
        end
        unless finished
          raise Error, "the idempotent transaction was rolled back (ActiveRecord::Rollback): nothing was " \
                       "recorded, the delivery fails so Sidekiq retries it"
        end
        result
      end

      def initialize(connection)
        @connection = connection
      end

      # Runs IdempotentJob.claim_sql on ActiveRecord's connection, inside its transaction.
      # @return [Hash] the decision, from Native.decide
      # @raise [LockTimeoutError] when another delivery held the operation past lock_timeout
      def claim(request, lock_timeout)
        @connection.materialize_transactions if @connection.respond_to?(:materialize_transactions)
        token = SecureRandom.uuid
        raw = @connection.raw_connection
        raw.exec_params("SELECT set_config('lock_timeout', $1, true)", ["#{(lock_timeout * 1000).ceil}ms"])
        row = raw.exec_params(IdempotentJob.claim_sql, claim_params(request, token)).first
        raw.exec("SET LOCAL lock_timeout TO DEFAULT")
        IdempotentJob::Native.decide(typed(row), token, request)
      rescue PG::LockNotAvailable => e
        raise LockTimeoutError, "#{request[:job_type]} operation #{request[:operation_key].inspect}: another " \
                                "delivery kept it locked for more than #{lock_timeout} s: #{e.message.strip}"
      end

      # Applies a fenced change (the completion) on ActiveRecord's connection.
      # @raise [LostClaimError] when the claim is no longer held
      def fenced(change, job_type, operation_key, token, text)
        params = [job_type, operation_key, token]
        params << text if TEXT_CHANGES.include?(change)
        result = @connection.raw_connection.exec_params(IdempotentJob::Native.fenced_sql(change), params)
        return true if result.cmd_tuples == 1

        raise LostClaimError, "cannot #{change} #{job_type} operation #{operation_key.inspect}: claim #{token} " \
                              "is no longer held"
      end

      private

      def claim_params(request, token)
        [request[:job_type], request[:operation_key], token, request[:jid], request[:lease].to_s,
         request[:args_digest], request[:job_class], request[:queue], request[:args_json],
         request[:refuse_mismatch] ? "true" : "false"]
      end

      # The claim row's values (text, or typed when the connection has a result type
      # map) → the types Native.decide reads.
      def typed(row)
        { won: boolean(row["won"]), status: row["status"], last_claim: row["last_claim"],
          attempts: Integer(row["attempts"]), jid: row["jid"], duplicates: Integer(row["duplicates"]),
          mismatch: boolean(row["mismatch"]), lease_remaining: Float(row["lease_remaining"]) }
      end

      def boolean(value)
        [true, "t", "true"].include?(value)
      end
    end
  end
end
