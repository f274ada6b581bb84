# frozen_string_literal: true

require "json"
require "pg"
require "sidekiq"

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

  # Seconds the bodies of CaptureOrderJob and EmailReceiptJob hang: a fault injected only
  # into the demo's first worker (DEMO_STALL_SECONDS), which the demo then SIGKILLs.
  def self.stall_seconds
    ENV.fetch("DEMO_STALL_SECONDS", "0").to_f
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
    SQL

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
