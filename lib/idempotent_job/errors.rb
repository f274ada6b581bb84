# frozen_string_literal: true

module IdempotentJob
  # Base class of every exception the gem raises. Loaded before the native library,
  # which raises these classes by name. Every class, its attributes, whether it is
  # always retryable and whether it sends a delivery back are checked against the core's
  # error table (`Native.error_table_json`) by spec/idempotent_job/errors_spec.rb.
  #
  # @!attribute [r] sqlstate
  #   @return [String, nil] PostgreSQL's five-character SQLSTATE, when the database sent one
  class Error < StandardError
    attr_reader :sqlstate

    # @return [Boolean] whether retrying the same call later may succeed
    def retryable?
      false
    end

    # Whether a delivery whose claim failed with this error before its body ran goes back
    # to its queue rather than failing (the core's rule, set by the native layer: any
    # answer of the database or an outage, not a bad key or option); for an exception
    # raised by Ruby code, {#retryable?}.
    # @return [Boolean]
    def sends_back?
      @sends_back.nil? ? retryable? : @sends_back
    end
  end

  # Invalid configuration or option: a bad database_url, an unknown key, a
  # lease shorter than 0.25 s. Fix the code or settings; retrying does not help.
  class ConfigurationError < Error; end

  # A record the database holds but the core cannot read (a time edited by hand to
  # 'infinity', which no Ruby Time holds): the message names the record and the column.
  # A {ConfigurationError} (not retried: reading again reads the same value), its own
  # class so that a caller (the operators' page) can tell it from a refused argument.
  class UnreadableRecordError < ConfigurationError; end

  # PostgreSQL could not be reached or the connection was lost (no pooled connection
  # free within checkout_timeout is a {TimeoutError}). The job body did not run
  # (fail closed); the queue's retry will try again.
  class ConnectionError < Error
    # @return [Boolean] always true
    def retryable?
      true
    end
  end

  # PostgreSQL answered with an error; {#message} is its own text and {#sqlstate}
  # its code. SQLSTATE 42P01 means the migration has not been run; 42703 that the
  # table lacks columns (it drifted from the migrations: the message names them).
  class DatabaseError < Error
    # @return [Boolean] true for an answer that usually passes (set by the native core):
    #   25006 read-only (a failover in progress), 40001 serialization failure, 40P01
    #   deadlock, 58000/58030 system and I/O errors, class 53 (too many connections, out
    #   of memory, disk full); retrying the same call later may succeed. False otherwise.
    def retryable?
      @retryable == true
    end
  end

  # A completion or release was refused because the claim's fencing token is no
  # longer the record's: the lease ran out and another delivery took the operation
  # over. The body ran; the other delivery may run it again.
  #
  # @!attribute [r] job_type
  #   @return [String] the record's job type
  # @!attribute [r] operation_key
  #   @return [String] the record's operation key
  class LostClaimError < Error
    attr_reader :job_type, :operation_key
  end

  # A migration failed; its transaction was rolled back.
  class MigrationError < Error; end

  # The idempotency_key declaration of a job is malformed, or a delivery's arguments
  # do not yield an operation key (missing, nil, empty or an unsupported type). The
  # job body is not run and nothing is recorded. Its attributes are those of the core's
  # error table (host-set: the gem fills them in where it refuses the key).
  #
  # @!attribute [r] job_type
  #   @return [String, nil] the record's job type (the job's scope), nil when not known
  #     (a malformed declaration found as the class is declared)
  # @!attribute [r] job_class
  #   @return [String] the job class name
  # @!attribute [r] declaration
  #   @return [Object] the idempotency_key declaration as given
  class OperationKeyError < Error
    attr_reader :job_type, :job_class, :declaration

    # @param message [String] what is wrong
    # @param job_type [String, nil] the record's job type, when known
    # @param job_class [String, Class] the job class
    # @param declaration [Object] the idempotency_key declaration
    def initialize(message, job_type: nil, job_class: nil, declaration: nil)
      @job_type = job_type&.to_s
      @job_class = job_class&.to_s
      @declaration = declaration
      super(message)
    end
  end
end

module IdempotentJob
  # A job's `idempotency_lookup` method raised or answered something other than
  # :done, :not_done or :unknown. The body was not run; the stale claim's lease was
  # ended so the next delivery (the queue's retry) asks the lookup again. The original
  # exception, if any, is the `cause`.
  #
  # @!attribute [r] job_type
  #   @return [String] the record's job type
  # @!attribute [r] operation_key
  #   @return [String] the record's operation key
  class LookupError < Error
    attr_reader :job_type, :operation_key
  end

  # A delivery's arguments differ from those of the operation's claim (same operation
  # key, different payload) and the job declares `idempotency_on_mismatch: :raise`.
  # The body was not run.
  #
  # @!attribute [r] job_type
  #   @return [String] the record's job type
  # @!attribute [r] operation_key
  #   @return [String] the record's operation key
  class PayloadMismatchError < Error
    attr_reader :job_type, :operation_key
  end
end

module IdempotentJob
  # A transactional job (`idempotency_transaction:`) waited longer than its lock
  # timeout for another delivery of the same operation, whose transaction is still
  # open. Nothing was run or recorded; retryable (the retry sees the other's outcome).
  class LockTimeoutError < Error
    # @return [Boolean] always true
    def retryable?
      true
    end
  end
end

module IdempotentJob
  # A configured timeout ran out: `connect_timeout` (connecting), `checkout_timeout`
  # (waiting for a pooled connection) or `statement_timeout` (SQLSTATE 57014). Nothing
  # was decided; the job body did not run. Retryable.
  class TimeoutError < Error
    # @return [Boolean] always true
    def retryable?
      true
    end
  end
end
