# frozen_string_literal: true

require_relative "idempotent_job/version"
require_relative "idempotent_job/errors"
require_relative "idempotent_job/dependency"
require_relative "idempotent_job/native" # the core's tables (job options) are read as the files below load
require_relative "idempotent_job/configuration"
require_relative "idempotent_job/result_json"
require_relative "idempotent_job/key"
require_relative "idempotent_job/args_digest"
require_relative "idempotent_job/record"
require_relative "idempotent_job/claim"
require_relative "idempotent_job/heartbeat_watch"
require_relative "idempotent_job/job"
require_relative "idempotent_job/transaction"
require_relative "idempotent_job/transactional"
require_relative "idempotent_job/job_options"
require_relative "idempotent_job/delivery"
require_relative "idempotent_job/outcome"
require_relative "idempotent_job/door"
require_relative "idempotent_job/protocol"
require_relative "idempotent_job/plain"
require_relative "idempotent_job/events"
require_relative "idempotent_job/telemetry"
require_relative "idempotent_job/repeats"
require_relative "idempotent_job/producer"
require_relative "idempotent_job/enqueue_check"
require_relative "idempotent_job/store_lifecycle"
require_relative "idempotent_job/rails_database" # read by the Railtie, or by an initializer naming a database
require_relative "idempotent_job/optional_parts"

# Durable idempotency records in PostgreSQL for at-least-once job queues.
#
# A job declares its operation key (`sidekiq_options idempotency_key: :order_id`); the
# queue's door (e.g. `require "idempotent_job/sidekiq"`) claims the operation before the
# body runs and records its completion, so a repeated delivery of the same operation
# does not run the body again. See README.md.
module IdempotentJob
  @lock = Mutex.new

  class << self
    # @return [Configuration] the current settings
    def configuration
      @lock.synchronize { @configuration ||= Configuration.new }
    end

    # Changes the settings; the connection pool is rebuilt on next use. Once the new
    # settings are in place, and before this returns, the replaced pool's queued repeat
    # bookkeeping is written ({settle_repeats}; a failure to write it is logged, never
    # raised: it is telemetry); the replaced pool is closed (its connections and
    # threads) as soon as the calls, transactions and heartbeats in flight on it are
    # done.
    # @param settings [Hash{Symbol => Object}] settings to set first (see
    #   Configuration::SETTINGS), e.g. `configure(pool_size: 20)`
    # @yieldparam config [Configuration] optional block form
    # @return [Configuration]
    # @raise [ConfigurationError] for an unknown setting or invalid values (checked
    #   without connecting; a missing database_url is reported at first use)
    def configure(**settings)
      # Changes apply to a copy, which replaces the settings only once it is valid.
      candidate = configuration.dup
      candidate.update(**settings)
      yield candidate if block_given?
      candidate.validate!
      StoreLifecycle.build(candidate) if candidate.database_url || candidate.host
      replaced = @lock.synchronize do
        @configuration = candidate
        @store.tap { @store = nil }
      end
      StoreLifecycle.retire(replaced, configuration.logger)
      candidate
    end

    # Forgets all settings and the connection pool (tests), after writing the pool's
    # queued repeat bookkeeping and closing it as {configure} does.
    # @return [void]
    def reset!
      replaced = @lock.synchronize do
        @configuration = nil
        @store.tap { @store = nil }
      end
      StoreLifecycle.retire(replaced, configuration.logger)
    end

    # Creates or updates the schema: applies each SQL file of `migrations/` not yet
    # recorded in `idempotent_job_schema_migrations`. Safe to run twice and from
    # several processes at once (an advisory lock serialises them).
    # @return [Array<String>] names of the migrations applied now (empty when up to date)
    # @raise [MigrationError, ConnectionError, ConfigurationError]
    def migrate!
      store.migrate
    end

    # Runs the block at most once per operation, for any consumer (an SQS poller, a
    # webhook handler, a rake task): the plain Ruby door of the claim protocol.
    #
    #   outcome = IdempotentJob.perform_once("ChargeOrder", order_id, lease: 60, payload: [order_id, cents]) do |claim|
    #     Gateway.charge(order_id, cents, reference: claim.operation_key)
    #   end
    #   outcome.ran?          # the block ran (and its completion was recorded)
    #   outcome.retry_after   # for :in_progress: seconds after which to try again
    #
    # With `store_result: true` the block's value is stored as JSON with the completion
    # (up to {Configuration#max_result_bytes}); a repeat gets it back: `outcome.value`,
    # `outcome.replayed?` true. With `wait: seconds` a call that meets a live claim waits
    # for that claim's completion (then replays), or its release (then may run), for at
    # most that long; then `:in_progress`.
    #
    # A raising block releases the claim (the next call claims it as a retry) and the
    # exception is re-raised; an interrupt (Interrupt, SignalException) keeps it for
    # its lease and the stale policy, as a worker's shutdown does.
    # @param job_type [String, #to_s] the job type the record is stored under
    # @param operation_key [String, Symbol, Integer, Hash, Array] the operation key: a
    #   scalar as is, a Hash/Array as canonical JSON; never nil or empty; job type plus
    #   key at most 2000 bytes, no NUL character
    # @param lease [Numeric, nil] seconds (at least {JobOptions::MIN_LEASE}); nil: the configured lease
    # @param payload [Array, Object] what the operation carries: digested to notice a
    #   mismatch; stored when this delivery takes a stale claim over, for `resolve(as: :rerun)`
    # @param id [String, nil] this delivery's id (a message id); nil: a new UUID
    # @param deferrals [Integer] times this delivery met a live claim before (e.g. an SQS
    #   receive count minus one): {Outcome#retry_after} grows with it
    # @param facts [Hash] facts of this attempt, stored with the claim where the record keeps them
    # @param job_class [String, nil] the job class a rerun sends (default the job type): stored
    #   when this delivery takes a stale claim over (the claim a hold follows); every
    #   delivery's is listed in the repeats report
    # @param queue [String, nil] the queue a rerun sends to, stored with `job_class`
    # @param options [Hash] `on_stale:`, `on_mismatch:`, `lookup:` (callable: key → :done,
    #   :not_done, :unknown), `heartbeat:`, `max_run:`, `transaction:`, `lock_timeout:`,
    #   `store_result:` (true/false, default false: store the block's value for replays),
    #   `max_takeovers:` (Integer, default none: stale takeovers before the next is held),
    #   `wait:` (seconds, default none: how long to wait for a live claim; not with
    #   `transaction:`); not `on_enqueue:` (perform_once pushes nothing: refused)
    # @yieldparam claim [Claim] the claim held
    # @return [Outcome] decision :ran (with the block's value), :completed (with the
    #   stored value when `replayed?`), :held, :given_up or :in_progress (with
    #   retry_after and lease_remaining)
    # @raise [OperationKeyError] for a bad operation key (nothing recorded)
    # @raise [ConfigurationError] for a bad option, a job type that is not valid UTF-8, or
    #   `facts:` that are not a Hash
    # @raise [ConnectionError, TimeoutError, DatabaseError] when the claim cannot be decided
    # @raise [LookupError, PayloadMismatchError, LostClaimError] as {Protocol#run}
    # @raise [Exception] what the block raised, after releasing the claim (an interrupt:
    #   after keeping it)
    def perform_once(job_type, operation_key, **options, &)
      Plain.perform_once(job_type, operation_key, **options, &)
    end

    # A job type as the core takes it: its text as UTF-8 (a binary or other-encoded
    # String holding valid UTF-8 is accepted as that text).
    # @param job_type [String, Class, #to_s] the job type (idempotency scope)
    # @return [String] the job type, UTF-8
    # @raise [ConfigurationError] when it is not valid UTF-8 (it names the job type with its
    #   bytes escaped); nothing is read, run or recorded
    def job_type_text(job_type)
      type = job_type.to_s
      text = case type.encoding
             when Encoding::UTF_8 then type
             when Encoding::BINARY, Encoding::US_ASCII then type.dup.force_encoding(Encoding::UTF_8)
             else type.encode(Encoding::UTF_8)
             end
      return text if text.valid_encoding?

      raise EncodingError
    rescue EncodingError
      raise ConfigurationError, "the job type #{type.b.inspect} is not valid UTF-8: job types are text; " \
                                "nothing was run or recorded"
    end

    # Reads one idempotency record.
    # @param job_type [String, Class] the job type (idempotency_scope; default the class name)
    # @param operation_key [String, Integer] the operation key as stored ("42" for 42)
    # @return [Record, nil] nil when the operation was never claimed
    # @raise [OperationKeyError] for a key that is not valid UTF-8 (no record can have it)
    # @raise [ConfigurationError] for a job type that is not valid UTF-8
    # @raise [ConnectionError, DatabaseError]
    def record(job_type, operation_key)
      job_type = job_type_text(job_type)
      row = store.find(job_type.to_s, Key.stored_text(job_type, operation_key))
      row && Record.from_row(row)
    end

    # Operations held by the :hold policy, waiting for a person, oldest first.
    # @param job_type [String, Class, nil] only this job type; nil for all
    # @param limit [Integer] at most this many (1 or more; beyond 64 bits, no limit)
    # @return [Array<Record>] each with job_type, operation_key, held_at (since),
    #   attempts, jid (the last claiming delivery), job_class, queue and args
    # @raise [ConfigurationError] for a job type that is not valid UTF-8, a limit below 1
    #   or not an Integer (1.5, "5")
    # @raise [UnreadableRecordError] naming a held record and its column the core cannot
    #   read (a time edited to 'infinity'; Python's `held`, keys only, lists it; the web
    #   page marks its row)
    # @raise [ConnectionError, DatabaseError]
    def held(job_type: nil, limit: Native::DEFAULT_HELD_LIMIT)
      # A record resolved between the two reads is left out.
      # Beyond 64 bits clamped, as Python's held: a huge limit is no limit, a hugely
      # negative one refused by the core as below 1. Anything but an Integer (1.5, "5")
      # is refused by the native store in the core's words, not taken as a whole number.
      limit = limit.clamp(-(2**63), (2**63) - 1) if limit.is_a?(Integer)
      store.held(job_type && job_type_text(job_type), limit).filter_map { |type, key| record(type, key) }
           .select { |r| r.status == :held }
    end

    # Registers a rerun sender for what no door enqueues (a plain {perform_once} caller's
    # own queue, an SQS consumer): {resolve} with `as: :rerun` calls the senders, latest
    # first, with the released {Record} (job_type, operation_key, job_class, queue, args of
    # the last claiming delivery) until one returns truthy (it sent the delivery again),
    # then asks the loaded doors (Sidekiq, ActiveJob). Python's `idempotent_job.on_rerun`.
    # @yieldparam record [Record] the released record (status :released), as the resolve
    #   left it: job_class, queue and args of the last claiming delivery
    # @yieldreturn [Boolean] whether this sender sent it
    # @return [Proc] the sender
    # @raise [ArgumentError] without a block
    def on_rerun(&sender)
      raise ArgumentError, "on_rerun needs a block" unless sender

      @lock.synchronize { @rerun_senders = [*@rerun_senders, sender] }
      sender
    end

    # Settles a held (or given-up) operation, in one statement that both checks and
    # changes the record (no other delivery or resolve can come between the two).
    # * `as: :done` — the effect is known to have happened: the record becomes completed
    #   and later deliveries are skipped;
    # * `as: :rerun` — run it again: the record is released and the stored job (class,
    #   arguments, queue of the last claiming delivery) is re-sent by the first sender
    #   registered with {on_rerun} that takes it, else re-enqueued by the loaded door of
    #   its kind; that delivery claims it as a retry and runs once (with neither, a
    #   warning says it was only released: it runs at its next delivery or perform_once call).
    # @param job_type [String, Class] the job type (idempotency scope)
    # @param operation_key [String, Integer] the operation key as stored
    # @param as [Symbol] :done or :rerun
    # @return [Record] the record as the resolve left it (status :completed or :released;
    #   what the statement answered, not a later read)
    # @raise [Error] when there is no record of the operation, or it is not held or given up
    #   (the message names the status it has, read after the refusal)
    # @raise [OperationKeyError] for a key that is not valid UTF-8
    # @raise [ConfigurationError] for another `as:`, a job type that is not valid UTF-8, or a
    #   rerun of a record with no stored job (held without the takeover that stores it)
    # @raise [ConnectionError, DatabaseError]; a failed re-enqueue raises the queue's error
    #   after the record was released (enqueue the job again to run it)
    def resolve(job_type, operation_key, as:)
      job_type = job_type_text(job_type)
      resolution = Native.resolution(as) # the core's names and words (Python's too)
      row = store.resolve(job_type.to_s, Key.stored_text(job_type, operation_key), resolution)
      raise Error, unsettled(job_type, operation_key) unless row

      Record.from_row(row).tap { |resolved| rerun(resolved) if resolution == :rerun }
    end

    # Deletes finished records — completed, or given up — that finished more than
    # `older_than` seconds ago, in batches of `batch_size`, each its own short
    # transaction that skips rows a claim has locked, so claims are never blocked for
    # long. Held records and claims (live or stale) are never purged. The batches walk
    # the retention index once, each starting after the last record the previous one
    # took (keyset pagination), so the time grows with the records deleted; a record
    # skipped because a claim had it locked is left for the next purge.
    # @param older_than [Numeric] seconds; default {Configuration#retention}
    # @param batch_size [Integer] records per batch (default 1000)
    # @yieldparam total [Integer] records deleted so far, after each batch
    # @return [Integer] records deleted
    # @raise [ConfigurationError] for an age that is negative or no number (true, "30"), or
    #   a batch below 1 or not an Integer
    # @raise [ConnectionError, TimeoutError, DatabaseError]
    def purge(older_than: configuration.retention, batch_size: Native::DEFAULT_PURGE_BATCH)
      total = 0
      cursor = nil
      loop do
        # A batch that is not an Integer (1.5, "5") is refused by the native store in the
        # core's words, not taken as a whole number.
        # An age that is no number of seconds (true, "30", nil) likewise.
        deleted, picked, cursor = store.purge_batch(older_than, batch_size, cursor)
        total += deleted
        Events.publish(:purge_batch, deleted:, total:, older_than:) if deleted.positive?
        yield total if block_given? && deleted.positive?
        break if picked < batch_size
      end
      total
    end

    # Operations delivered more than once since `since`, each repeat classified from the
    # facts recorded with it: :concurrent_copy (it met a live claim), :queue_retry (the
    # same delivery retried by the queue), :redelivery (the same delivery again without a
    # retry, or a takeover of a dead worker's claim; matched to a recorded deploy/restart
    # within `restart_window` seconds), :re_enqueue_same_producer,
    # :re_enqueue_other_producer, :re_enqueue (no producer recorded), :unknown (no facts).
    # See {Repeats::Classifier}; {Repeats.report} adds the summary per job type, the
    # producer pairs, text lines and CSV.
    # @param since [Time, Numeric] default 24 hours ago (a Time or epoch seconds)
    # @param job_type [String, Class, nil] only this job type
    # @param restarts [Array<Time, Numeric>] deploy/restart times
    # @param restart_window [Numeric] seconds (default 120)
    # @return [Array<Repeats::Operation>]; see also {Repeats.summary}
    # @raise [ConfigurationError] for a `since`/`restarts` that is not a time (a String
    #   included), a negative `restart_window`
    # @raise [ConnectionError, DatabaseError]
    def repeats(since: Time.now - Native::DEFAULT_REPEATS_SINCE, job_type: nil, restarts: [],
                restart_window: Native::DEFAULT_RESTART_WINDOW)
      Repeats.operations(since:, job_type:, restarts:, restart_window:)
    end

    # @return [String] the SQL behind {repeats} ($1 since, $2 job type or NULL)
    def repeats_sql
      Native.repeats_sql
    end

    # Receives the gem's events (see {Events}).
    # @param names [Array<Symbol>] events to receive (Events::NAMES); none means all
    # @yieldparam name [Symbol]
    # @yieldparam payload [Hash]
    # @return [Object] a handle for {unsubscribe}
    def subscribe(...)
      Events.subscribe(...)
    end

    # @param handle [Object] what {subscribe} returned
    # @return [void]
    def unsubscribe(handle)
      Events.unsubscribe(handle)
    end

    # The claim of the delivery running on this thread, set by the protocol (any door)
    # around the job body (and the stale-claim lookup).
    # @return [Claim, nil]
    def current_claim
      Thread.current[:idempotent_job_claim]
    end

    # The transaction handle of the transactional delivery running on this thread.
    # @return [Transaction, nil]
    def current_transaction
      Thread.current[:idempotent_job_transaction]
    end

    # Runs the block with `handle` as {current_transaction}. Internal.
    # @param handle [Transaction, nil]
    # @return [Object] the block's value
    def with_transaction(handle, &)
      with_thread_value(:idempotent_job_transaction, handle, &)
    end

    # Runs the block with `claim` as {current_claim}. Internal.
    # @param claim [Claim]
    # @return [Object] the block's value
    def with_claim(claim, &)
      with_thread_value(:idempotent_job_claim, claim, &)
    end

    # @return [String] the SQL of every migration, in order (for teams that manage
    #   migrations with their own tools)
    def schema_sql
      Native.schema_sql
    end

    # @return [String] the one statement that decides a delivery (claim or duplicate)
    def claim_sql
      Native.claim_sql
    end

    # Writes this process's queued repeat bookkeeping (the duplicates count, repeat times
    # and delivery facts that duplicates leave off their decision's path) now, instead of
    # within the next few milliseconds; logs a warning when repeats were dropped since
    # the last call. Called at exit; a process that leaves with
    # `exit!` or is killed loses what was still queued (telemetry only, never a
    # decision). Does nothing when this process never built its store.
    # @return [void]
    # @raise [ConnectionError, TimeoutError, DatabaseError] when the write fails
    def settle_repeats
      built = @lock.synchronize { @store }
      return unless built

      built.settle_repeats
      nil
    ensure
      StoreLifecycle.report_dropped(built, configuration.logger) if built
    end

    # The native store of the current settings, created on first use. Internal.
    # @return [IdempotentJob::Native::Store]
    # @raise [ConfigurationError] when the settings are invalid
    def store
      @lock.synchronize { @store ||= StoreLifecycle.build(@configuration ||= Configuration.new) }
    end

    # @return [Logger] where the gem logs its decisions
    def logger
      configuration.logger
    end

    private

    # Why {resolve} changed nothing, worded from the record as it is now.
    def unsettled(job_type, operation_key)
      name = "#{job_type} operation #{operation_key.to_s.inspect}"
      now = record(job_type, operation_key) or return "no record for #{name}: nothing to resolve"
      "#{name} is not held or given up (status: #{now.status.inspect})"
    end

    def with_thread_value(name, value)
      previous = Thread.current[name]
      Thread.current[name] = value
      yield
    ensure
      Thread.current[name] = previous
    end

    def rerun(record)
      name = "#{record.job_type} operation #{record.operation_key.inspect}"
      senders = @lock.synchronize { (@rerun_senders || []).reverse }
      if senders.any? { |sender| sender.call(record) } || Door.registered.any? { |door| door.rerun(record) }
        logger.warn("idempotent_job: #{name} resolved for a rerun: #{record.job_class} re-enqueued")
      else
        logger.warn("idempotent_job: #{name} resolved for a rerun: released only; no sender registered with " \
                    "IdempotentJob.on_rerun and no loaded door enqueues #{record.job_class.inspect}, so its " \
                    "next delivery (or perform_once call) runs it")
      end
    end
  end
end

# A normal exit writes what the process still has queued for the repeats report.
at_exit do
  IdempotentJob.settle_repeats
rescue IdempotentJob::Error => e
  IdempotentJob.logger&.warn("idempotent_job: repeat bookkeeping not written at exit (#{e.message})")
end

require_relative "idempotent_job/railtie" if defined?(Rails::Railtie)
