# frozen_string_literal: true

require "digest/sha2"
require "json"
require "logger"
require "securerandom"
require "idempotent_job/sidekiq"

module IdempotentJobBench
  # One delivery's inputs, generated before the clock starts: the operation key, the
  # job id, and the stored payload (arguments as JSON and their digest), as the
  # middleware would send them.
  Op = Struct.new(:key, :jid, :args_json, :digest) do
    # @param key [String, nil] the operation key; a random one when nil
    # @return [Op]
    def self.fresh(key = nil)
      key ||= SecureRandom.hex(16)
      args_json = JSON.generate([key])
      new(key, SecureRandom.hex(12), args_json, Digest::SHA256.hexdigest(args_json))
    end
  end

  # Where the gem's settings for a benchmark pass are applied.
  module Gem
    # Logs of the gem go nowhere: a duplicate is logged at info level, and the
    # benchmark measures the decision, not the terminal.
    NULL_LOGGER = Logger.new(File::NULL)

    # Points the gem's facade (and so its middleware) at `url` with a pool of `pool_size`.
    # @param url [String] PostgreSQL URL
    # @param pool_size [Integer] pooled connections
    # @return [void]
    # @raise [IdempotentJob::ConfigurationError]
    def self.configure(url, pool_size:)
      IdempotentJob.configure(database_url: url, pool_size:, logger: NULL_LOGGER)
    end

    # A native store of its own, beside the facade's (internal API, as the facade builds it).
    # @param url [String] PostgreSQL URL
    # @param pool_size [Integer]
    # @param schema [String, nil] schema of the record table
    # @param prepared_statements [Boolean] the gem's setting (named statements cached per connection)
    # @param asynchronous_completion [Boolean] the gem's setting (proposal A)
    # @return [IdempotentJob::Native::Store]
    # @raise [IdempotentJob::ConfigurationError]
    def self.store(url, pool_size:, schema: nil, prepared_statements: true, asynchronous_completion: false)
      config = IdempotentJob::Configuration.new.update(database_url: url, schema:, pool_size:, prepared_statements:,
                                                       asynchronous_completion:)
      IdempotentJob::Native::Store.new(config.validate!.to_native_json)
    end

    # Runs the block with the facade's store (IdempotentJob.store, the one
    # IdempotentJob.perform_once delivers through) set to `store`, then puts the facade's
    # own back: benchmark-only (it sets the facade's internals), so a variant delivers
    # through the one-call API on a store of its own settings (schema, prepared
    # statements, asynchronous completion). One swap at a time: the threads delivering
    # meanwhile all use `store`.
    # @param store [IdempotentJob::Native::Store, nil] nil: the facade's own, unchanged
    # @return [Object] the block's value
    def self.using(store)
      return yield if store.nil?

      lock = IdempotentJob.instance_variable_get(:@lock)
      previous = lock.synchronize do
        IdempotentJob.instance_variable_get(:@store).tap { IdempotentJob.instance_variable_set(:@store, store) }
      end
      begin
        yield
      ensure
        lock.synchronize { IdempotentJob.instance_variable_set(:@store, previous) }
      end
    end

    # One delivery of `delivery` (a benchmark job of type Variant::JOB_TYPE, its key its
    # one argument) through IdempotentJob.perform_once with a no-op body, on the
    # facade's store (see {.using}).
    # @param delivery [Op]
    # @return [Symbol] the outcome's decision (:ran for a new operation, :completed for a duplicate)
    def self.deliver(delivery)
      IdempotentJob.perform_once(Variant::JOB_TYPE, delivery.key, payload: [delivery.key], id: delivery.jid,
                                                                  lease: Variant::LEASE, job_class: Variant::JOB_TYPE,
                                                                  queue: "default") { nil }.decision
    end
  end

  # A job class for the middleware variant (never enqueued): its key is its only argument.
  class BenchJob
    include ::Sidekiq::Job
    sidekiq_options idempotency_key: 0

    # @param _key [String]
    # @return [nil]
    def perform(_key); end
  end

  # {BenchJob} without the lease-renewing heartbeat (a diagnostic variant: what the
  # heartbeat's start and stop cost a delivery).
  class BenchJobNoHeartbeat < BenchJob
    sidekiq_options idempotency_heartbeat: false
  end

  # A way of recording deliveries that the benchmark times. Each variant answers
  # {#first} (a first delivery: claim, then completion) and {#duplicate} (a delivery
  # of an operation already completed: turned away); both raise when the database
  # answered something else, so a broken variant cannot look fast.
  class Variant
    # Job type of the records the benchmark writes.
    JOB_TYPE = "BenchJob"
    # Lease in seconds sent with each claim.
    LEASE = 300.0

    # @return [Symbol] short name (CSV subject)
    attr_reader :name
    # @return [String] what the printed table calls it
    attr_reader :label
    # @return [Symbol] the variant its ratio is computed against
    attr_reader :baseline

    # @param name [Symbol]
    # @param label [String]
    # @param baseline [Symbol] name of the variant to compare with
    def initialize(name, label, baseline: :floor)
      @name = name
      @label = label
      @baseline = baseline
    end

    # Closes what the variant opened.
    # @return [void]
    def close; end

    private

    # DELIVER_SQL's $1–$8 (the first-claim insert's, numbered as CLAIM_SQL's $1–$8): the
    # delivery's facts last (none: the gem variant's request sends none either).
    def deliver_params(delivery, token)
      [JOB_TYPE, delivery.key, token, delivery.jid, LEASE, delivery.digest, JOB_TYPE, nil]
    end

    def expect!(condition, what)
      raise "#{label}: #{what}" unless condition
    end
  end

  # The floor: the gem's own statements (IdempotentJob::Native.deliver_sql, the
  # statement that decides a first delivery or a duplicate outside a transaction, and
  # IdempotentJob::Native.fenced_sql(:complete), read from the extension) sent raw with
  # the pg gem on one connection: named prepared statements, prepared once, then
  # exec_prepared (one round trip each), as the gem sends them by default
  # (`prepared_statements: true`). Options:
  # * named: false — unnamed statements (exec_params), as the gem sends them with
  #   `prepared_statements: false` (behind PgBouncer in transaction mode);
  # * async: :complete — the completion commits asynchronously
  #   (the core's own asynchronous completion statement, `Fenced::CompleteAsynchronously`:
  #   proposal A, the gem's `asynchronous_completion`); the claim stays durable.
  class Floor < Variant
    # @param conn [PG::Connection] a connection of its own
    # @param name [Symbol]
    # @param label [String]
    # @param named [Boolean] use named prepared statements
    # @param async [Symbol, nil] :complete (see above), or nil
    def initialize(conn, name: :floor, label: "floor: same SQL, raw pg, named prepared", named: true, async: nil)
      super(name, label, baseline: name == :floor_nosync ? name : :floor)
      @conn = conn
      @named = named
      @claim = IdempotentJob::Native.deliver_sql
      @complete = IdempotentJob::Native.fenced_sql(async == :complete ? :complete_asynchronously : :complete)
      prepare if named
    end

    # Claims and completes a new operation.
    # @param delivery [Op]
    # @return [void]
    # @raise [RuntimeError, PG::Error]
    def first(delivery)
      token = SecureRandom.uuid
      inserted = run(:claim, deliver_params(delivery, token)).getvalue(0, 0)
      expect!(inserted == "t", "the claim of a new operation was not won")
      # $4, $5: no result stored (the V7 columns stay NULL, nobody is notified).
      done = run(:complete, [JOB_TYPE, delivery.key, token, nil, nil]).cmd_tuples
      expect!(done == 1, "the completion changed #{done} rows")
    end

    # Sends the delivery statement for a completed operation (a read: nothing written).
    # @param delivery [Op]
    # @return [void]
    # @raise [RuntimeError, PG::Error]
    def duplicate(delivery)
      row = run(:claim, deliver_params(delivery, SecureRandom.uuid)).first
      expect!(row["inserted"] == "f" && row["status"] == "completed", "a duplicate was not turned away: #{row}")
    end

    # @return [void]
    def close
      @conn.close
    end

    private

    def prepare
      @conn.prepare("bench_claim", @claim)
      @conn.prepare("bench_complete", @complete)
    end

    def run(statement, params)
      if @named
        @conn.exec_prepared("bench_#{statement}", params)
      else
        @conn.exec_params(statement == :claim ? @claim : @complete, params)
      end
    end
  end

  # One raw round trip: the primary-key read of the record (unnamed statement, pg
  # gem). The least a duplicate could cost: one round trip, no write.
  class RoundTrip < Variant
    # Reads one record by its key.
    SQL = "SELECT status FROM idempotent_job_records WHERE job_type = $1 AND operation_key = $2"

    # @param conn [PG::Connection]
    def initialize(conn)
      super(:round_trip, "one raw round trip (pg: PK read of the record)")
      @conn = conn
    end

    # Reads a completed record.
    # @param delivery [Op]
    # @return [void]
    # @raise [RuntimeError, PG::Error]
    def duplicate(delivery)
      status = @conn.exec_params(SQL, [JOB_TYPE, delivery.key]).getvalue(0, 0)
      expect!(status == "completed", "the record is #{status.inspect}")
    end

    # @return [void]
    def close
      @conn.close
    end
  end

  # The gem's plain one-call API: `IdempotentJob.perform_once` around a no-op body
  # (one native call: the read-only look, the claim, the body, the completion), on the
  # facade's store or on a store of its own settings ({Gem.using}).
  class GemStore < Variant
    # @param store [IdempotentJob::Native::Store, nil] nil: the facade's (IdempotentJob.store)
    # @param name [Symbol]
    # @param label [String]
    # @param baseline [Symbol]
    def initialize(store = nil, name: :gem, label: "gem: perform_once", baseline: :floor)
      super(name, label, baseline:)
      @store = store
    end

    # (see Floor#first)
    def first(delivery)
      decision = Gem.using(@store) { Gem.deliver(delivery) }
      expect!(decision == :ran, "a first delivery decided #{decision.inspect}")
    end

    # (see Floor#duplicate)
    def duplicate(delivery)
      decision = Gem.using(@store) { Gem.deliver(delivery) }
      expect!(decision == :completed, "a duplicate decided #{decision.inspect}")
    end
  end

  # The whole Sidekiq server middleware around a no-op body, without Sidekiq's
  # processor: options, operation key, argument digest, claim, heartbeat start and
  # stop, events, completion.
  class GemMiddleware < Variant
    # @param job_class [Class] the job class delivered ({BenchJob} or {BenchJobNoHeartbeat})
    # @param name [Symbol], label [String] (see Variant#initialize)
    def initialize(job_class = BenchJob, name: :middleware, label: "gem: Sidekiq server middleware")
      super(name, label)
      @middleware = IdempotentJob::Sidekiq::ServerMiddleware.new
      @job = job_class.new
    end

    # (see Floor#first)
    def first(delivery)
      ran = false
      @middleware.call(@job, job_hash(delivery), "default") { ran = true }
      expect!(ran, "the body of a first delivery did not run")
    end

    # (see Floor#duplicate)
    def duplicate(delivery)
      ran = false
      @middleware.call(@job, job_hash(delivery), "default") { ran = true }
      expect!(!ran, "the body of a duplicate ran")
    end

    private

    def job_hash(delivery)
      { "class" => @job.class.name, "args" => [delivery.key], "jid" => delivery.jid, "queue" => "default" }
    end
  end

  # What a team would write without the gem, with the pg gem: insert the record;
  # on conflict, read it; complete with an update. Its own narrow table. It keeps no
  # duplicate count, payload, repeat history or fencing beyond a token.
  class HandWritten < Variant
    # The table a team would create.
    TABLE_SQL = <<~SQL
      CREATE TABLE IF NOT EXISTS bench_handwritten_jobs (
          job_type      text        NOT NULL,
          operation_key text        NOT NULL,
          status        text        NOT NULL,
          token         uuid        NOT NULL,
          jid           text,
          locked_until  timestamptz NOT NULL,
          created_at    timestamptz NOT NULL DEFAULT now(),
          completed_at  timestamptz,
          PRIMARY KEY (job_type, operation_key))
    SQL
    # Claim a new operation.
    INSERT_SQL = "INSERT INTO bench_handwritten_jobs (job_type, operation_key, status, token, jid, locked_until) " \
                 "VALUES ($1, $2, 'running', $3, $4, now() + make_interval(secs => $5)) " \
                 "ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING token"
    # Read the record that was in the way.
    READ_SQL = "SELECT status, token, locked_until <= now() AS expired FROM bench_handwritten_jobs " \
               "WHERE job_type = $1 AND operation_key = $2"
    # Take over an expired claim (never reached by the benchmark's deliveries).
    TAKEOVER_SQL = "UPDATE bench_handwritten_jobs SET token = $3, jid = $4, " \
                   "locked_until = now() + make_interval(secs => $5) " \
                   "WHERE job_type = $1 AND operation_key = $2 AND token = $6 AND status = 'running'"
    # Record the completion.
    COMPLETE_SQL = "UPDATE bench_handwritten_jobs SET status = 'done', completed_at = now() " \
                   "WHERE job_type = $1 AND operation_key = $2 AND token = $3"

    # @param conn [PG::Connection]
    def initialize(conn)
      super(:hand_written, "hand-written: pg, insert / read / update")
      @conn = conn
      @conn.exec(TABLE_SQL)
    end

    # (see Floor#first)
    def first(delivery)
      token = claim(delivery)
      expect!(token, "a new operation was not claimed")
      done = @conn.exec_params(COMPLETE_SQL, [JOB_TYPE, delivery.key, token]).cmd_tuples
      expect!(done == 1, "the completion changed #{done} rows")
    end

    # (see Floor#duplicate)
    def duplicate(delivery)
      expect!(claim(delivery).nil?, "a duplicate was claimed")
    end

    # @return [void]
    def close
      @conn.close
    end

    private

    # @return [String, nil] the token when this delivery may run
    def claim(delivery)
      token = SecureRandom.uuid
      params = [JOB_TYPE, delivery.key, token, delivery.jid, LEASE]
      return token if @conn.exec_params(INSERT_SQL, params).ntuples == 1

      row = @conn.exec_params(READ_SQL, [JOB_TYPE, delivery.key]).first
      return nil unless row && row["status"] == "running" && row["expired"] == "t"

      @conn.exec_params(TAKEOVER_SQL, params + [row["token"]]).cmd_tuples == 1 ? token : nil
    end
  end
end
