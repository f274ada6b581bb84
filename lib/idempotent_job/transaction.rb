# frozen_string_literal: true

require "json"

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
end
