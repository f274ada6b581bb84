# frozen_string_literal: true

require "json"
require "pg"
require "sidekiq"
require "idempotent_job"

# Settings and effects shared by the demo's Sidekiq worker (boot.rb) and its producer
# (driver.rb).
module Demo
  # Default lease of every demo job, seconds. Short so that a delivery deferred behind a
  # live claim comes back within the demo; a real app keeps the gem's default (300 s) or
  # whatever exceeds its slowest job.
  LEASE = 10
  # Lease of CaptureOrderJob and EmailReceiptJob, the jobs whose worker the demo kills.
  CAPTURE_LEASE = 5
  EMAIL_LEASE = 4
  # How long a job body works before its effect, so concurrent copies overlap.
  WORK_SECONDS = 0.8
  # Redis keys of the demo's own bookkeeping (Demo::Arrivals in boot.rb).
  ARRIVALS_KEY = "idempotent_job_demo:arrivals"
  INFLIGHT_PREFIX = "idempotent_job_demo:inflight:"
  # Seconds each delivery of an operation spent in the worker (Demo::Arrivals), a list per operation.
  DURATIONS_PREFIX = "idempotent_job_demo:durations:"
  # What the fault-injected LedgerEntryJob saw inside its transaction before it was killed,
  # per order number (JSON): its pid, its PostgreSQL backend, its own uncommitted rows.
  UNCOMMITTED_KEY = "idempotent_job_demo:uncommitted"

  # Seconds the bodies of CaptureOrderJob, EmailReceiptJob and LedgerEntryJob hang: a fault injected only
  # into the demo's first worker (DEMO_STALL_SECONDS), which the demo then SIGKILLs.
  def self.stall_seconds
    ENV.fetch("DEMO_STALL_SECONDS", "0").to_f
  end

  # What the fault-injected LedgerEntryJob saw of its own transaction before the demo
  # killed it (written by the job, read by the producer and the report).
  module Uncommitted
    module_function

    # @param seen [Hash] "backend", "rows", "status" as the transaction saw them
    def store(order_id, seen)
      Sidekiq.redis { |redis| redis.hset(UNCOMMITTED_KEY, order_id, JSON.generate(seen.merge("pid" => Process.pid))) }
    end

    # @return [Hash, nil] "pid", "backend", "rows", "status" for an order, nil if not written yet
    def find(order_id)
      json = Sidekiq.redis { |redis| redis.hget(UNCOMMITTED_KEY, order_id) }
      json && JSON.parse(json)
    end
  end

  # The observable effects: one row per execution of a job body, written with the pg gem
  # on a connection per worker thread (independent of the gem's own pool).
  module Effects
    SCHEMA = <<~SQL
      CREATE TABLE IF NOT EXISTS demo_charges (
          job_type     text        NOT NULL,
          order_id     text        NOT NULL,
          amount_cents integer     NOT NULL,
          pid          integer     NOT NULL,
          created_at   timestamptz NOT NULL DEFAULT now()
      );
      CREATE TABLE IF NOT EXISTS demo_shipments (
          order_id   text        NOT NULL,
          carrier    text        NOT NULL,
          parcels    integer     NOT NULL,
          pid        integer     NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE TABLE IF NOT EXISTS demo_emails (
          order_id   text        NOT NULL,
          address    text        NOT NULL,
          pid        integer     NOT NULL,
          created_at timestamptz NOT NULL DEFAULT now()
      );
      -- Written by LedgerEntryJob inside its idempotent transaction. Deliberately no
      -- unique constraint: a second entry for an order would simply be a second row.
      CREATE TABLE IF NOT EXISTS demo_ledger (
          order_id     text        NOT NULL,
          amount_cents integer     NOT NULL,
          pid          integer     NOT NULL,
          created_at   timestamptz NOT NULL DEFAULT now()
      );
    SQL
    LEDGER_INSERT = "INSERT INTO demo_ledger (order_id, amount_cents, pid) VALUES ($1, $2, $3)"

    module_function

    def connection
      Thread.current[:idempotent_job_demo_pg] ||= PG.connect(ENV.fetch("DATABASE_URL"))
    end

    def create_tables
      connection.exec(SCHEMA)
    end

    def charge(job_type, order_id, amount_cents)
      connection.exec_params(
        "INSERT INTO demo_charges (job_type, order_id, amount_cents, pid) VALUES ($1, $2, $3, $4)",
        [job_type, order_id, amount_cents, Process.pid]
      )
    end

    def ship(order_id, carrier, parcels)
      connection.exec_params(
        "INSERT INTO demo_shipments (order_id, carrier, parcels, pid) VALUES ($1, $2, $3, $4)",
        [order_id, carrier, parcels, Process.pid]
      )
    end

    # The "email": a row per receipt sent, as a mail provider's log would show it.
    def email(order_id, address)
      connection.exec_params("INSERT INTO demo_emails (order_id, address, pid) VALUES ($1, $2, $3)",
                             [order_id, address, Process.pid])
    end

    # @return [Array<Hash>] the receipts sent for an order ("pid", "created_at"), oldest first
    def emails(order_id)
      connection.exec_params("SELECT pid, created_at FROM demo_emails WHERE order_id = $1 ORDER BY created_at",
                             [order_id]).to_a
    end

    # @return [Array<Integer>] pids of the processes that did the charge, one per row
    def charges(job_type, order_id)
      connection.exec_params("SELECT pid FROM demo_charges WHERE job_type = $1 AND order_id = $2",
                             [job_type, order_id]).column_values(0).map(&:to_i)
    end

    # @return [Array<Integer>] pids of the processes whose ledger entry for an order committed, one per row
    def ledger(order_id)
      connection.exec_params("SELECT pid FROM demo_ledger WHERE order_id = $1", [order_id])
                .column_values(0).map(&:to_i)
    end

    # @return [String, nil] the state of a PostgreSQL backend ("idle in transaction"…), nil once it has ended
    def backend_state(backend_pid)
      connection.exec_params("SELECT state FROM pg_stat_activity WHERE pid = $1", [backend_pid])
                .column_values(0).first
    end

    # @return [Array<Integer>] pids of the processes that did the shipment, one per row
    def shipments(order_id, carrier)
      connection.exec_params("SELECT pid FROM demo_shipments WHERE order_id = $1 AND carrier = $2",
                             [order_id, carrier]).column_values(0).map(&:to_i)
    end
  end
end

# Charges an order: the README's example, keyed by the order number.
class ChargeOrderJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, retry: 3

  # The operation key as the demo expects the gem to store it (for the demo's own counts).
  def self.demo_operation_key(args)
    args.fetch(0).to_s
  end

  def perform(order_id, amount_cents)
    sleep Demo::WORK_SECONDS
    Demo::Effects.charge(self.class.name, order_id, amount_cents)
  end
end

# Captures an order's payment, with a short lease. The demo starts its first worker with
# DEMO_STALL_SECONDS=30 (a fault injected into that process only): the body then hangs
# before its effect, and the demo SIGKILLs the worker while it holds the claim.
class CaptureOrderJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_lease: Demo::CAPTURE_LEASE, retry: 3

  def self.demo_operation_key(args)
    args.fetch(0).to_s
  end

  def perform(order_id, amount_cents)
    stall = Demo.stall_seconds
    if stall.positive?
      logger.info("demo: hanging #{stall} s before the effect (fault injected into this worker)")
      sleep stall
    end
    sleep Demo::WORK_SECONDS
    Demo::Effects.charge(self.class.name, order_id, amount_cents)
  end
end

# Emails an order's receipt: an effect outside the database, with a short lease and the
# :hold stale-claim policy. In the demo's first worker (DEMO_STALL_SECONDS) the body hangs
# AFTER sending, and the demo SIGKILLs the worker there: the record stays claimed and nobody
# knows from it whether the email went out. The next delivery after the lease takes the
# stale claim over and holds the operation (the body does not run) until a person settles
# it with `rake idempotent_job:resolve[EmailReceiptJob,KEY,done|rerun]`.
class EmailReceiptJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_lease: Demo::EMAIL_LEASE,
                  idempotency_on_stale: :hold, retry: 3

  def self.demo_operation_key(args)
    args.fetch(0).to_s
  end

  def perform(order_id, address)
    sleep Demo::WORK_SECONDS
    Demo::Effects.email(order_id, address)
    stall = Demo.stall_seconds
    return unless stall.positive?

    logger.info("demo: receipt sent; hanging #{stall} s before returning (fault injected into this worker)")
    sleep stall
  end
end

# Ships an order's parcels with a carrier: a composite key, one part a path into the
# Hash argument. The Hash's key order is not part of the key.
class ShipParcelJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: ["shipment.order_id", :carrier], retry: 3

  # A composite key is stored as canonical JSON (see IdempotentJob::Key).
  def self.demo_operation_key(args)
    JSON.generate([args.fetch(0).fetch("order_id"), args.fetch(1)])
  end

  def perform(shipment, carrier)
    sleep Demo::WORK_SECONDS
    Demo::Effects.ship(shipment.fetch("order_id"), carrier, shipment.fetch("parcels"))
  end
end

# Books an order's amount in the ledger: an effect in the same database as the
# idempotency record. With `idempotency_transaction: true` the claim, this INSERT and the
# completion commit in one PostgreSQL transaction: a concurrent copy waits on the record's
# row lock until that commit, then skips; a worker killed before the commit leaves neither
# the row nor the record. In the demo's first worker (DEMO_STALL_SECONDS) the body hangs
# AFTER its INSERT, with the transaction still open, and the demo SIGKILLs it there.
class LedgerEntryJob
  include Sidekiq::Job
  include IdempotentJob::Job # idempotent_transaction (the middleware would include it anyway)
  sidekiq_options idempotency_key: :order_id, idempotency_transaction: true, retry: 3

  def self.demo_operation_key(args)
    args.fetch(0).to_s
  end

  def perform(order_id, amount_cents)
    tx = idempotent_transaction or raise IdempotentJob::Error, "LedgerEntryJob runs only under the gem's middleware"
    sleep Demo::WORK_SECONDS
    tx.exec(Demo::Effects::LEDGER_INSERT, [order_id, amount_cents, Process.pid])
    stall = Demo.stall_seconds
    return unless stall.positive?

    seen_inside(tx, order_id)
    logger.info("demo: ledger row written, transaction open; hanging #{stall} s before commit " \
                "(fault injected into this worker)")
    sleep stall
  end

  private

  # For the demo's narration: what this transaction sees of its own uncommitted work.
  def seen_inside(transaction, order_id)
    inside = transaction.query(
      "SELECT pg_backend_pid() AS backend, (SELECT count(*) FROM demo_ledger WHERE order_id = $1) AS rows, " \
      "(SELECT status FROM idempotent_job_records WHERE job_type = $2 AND operation_key = $1) AS status",
      [order_id, self.class.name]
    ).first
    Demo::Uncommitted.store(order_id, inside)
  end
end

require_relative "active_job"
