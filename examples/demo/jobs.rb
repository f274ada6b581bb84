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
  # Lease of CaptureOrderJob, the job whose worker the demo kills.
  CAPTURE_LEASE = 5
  # How long a job body works before its effect, so concurrent copies overlap.
  WORK_SECONDS = 0.8
  # Redis keys of the demo's own bookkeeping (Demo::Arrivals in boot.rb).
  ARRIVALS_KEY = "idempotent_job_demo:arrivals"
  INFLIGHT_PREFIX = "idempotent_job_demo:inflight:"

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
    stall = ENV.fetch("DEMO_STALL_SECONDS", "0").to_f
    if stall.positive?
      logger.info("demo: hanging #{stall} s before the effect (fault injected into this worker)")
      sleep stall
    end
    sleep Demo::WORK_SECONDS
    Demo::Effects.charge(self.class.name, order_id, amount_cents)
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
