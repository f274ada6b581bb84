# frozen_string_literal: true

require "json"
require "securerandom"

module Demo
  # One operation of the demo, and how to count its effects.
  Operation = Struct.new(:scenario, :job_class, :key, :effects, keyword_init: true) do
    def id
      "#{job_class.name} #{key}"
    end

    def record
      IdempotentJob.record(job_class.name, key)
    end
  end

  # The Celery task of scenarios (l) (m) (n), by its name (its record's job type).
  CELERY_TASK = Struct.new(:name).new("demo_celery.charge_order")
  SQS_JOB = Struct.new(:name).new("demo_sqs.charge_order")

  # What the demo's steps share: the run tag (a prefix of every order number, so runs
  # against a long-lived database do not meet) and the deliveries made so far, kept in a
  # JSON file between the driver's processes.
  class State
    PATH = ENV.fetch("DEMO_STATE", File.expand_path("../../tmp/demo/state.json", __dir__))

    # @return [State] a new run
    def self.start
      new("run" => SecureRandom.hex(2), "deliveries" => {}).tap(&:save)
    end

    # @return [State] the run that `start` saved
    def self.load
      new(JSON.parse(File.read(PATH)))
    end

    def initialize(data)
      @data = data
    end

    def run
      @data.fetch("run")
    end

    def save
      File.write(PATH, JSON.pretty_generate(@data))
    end

    def order_id(number)
      "#{run}-#{number}"
    end

    # Counts deliveries the demo enqueued for one operation.
    def delivered(job_class, key, count = 1)
      id = "#{job_class.name} #{key}"
      @data["deliveries"][id] = deliveries(id) + count
    end

    def deliveries(id)
      @data["deliveries"].fetch(id, 0)
    end

    # @return [Array<Operation>] every operation of the demo, in table order
    def operations
      charges = ->(op) { Effects.charges(op.job_class.name, op.key) }
      [
        [ChargeOrderJob, 101, "(a) enqueued 3 times, 2 s apart"], [ChargeOrderJob, 102, "(b) 5 copies at once"],
        [ChargeOrderJob, 103, "(c) same jid twice"], [CaptureOrderJob, 104, "(d) worker SIGKILLed"],
        [ChargeOrderJob, 105, "(e) distinct"], [ChargeOrderJob, 106, "(e) distinct"],
        [ChargeOrderJob, 107, "(e) distinct"], [ChargeOrderJob, 111, "(j) two producers"]
      ].map do |job_class, number, scenario|
        Operation.new(scenario:, job_class:, key: order_id(number), effects: charges)
      end + [shipment, email, ledger_copies, ledger_crash, ActiveJobScenario.operation(self), *celery_operations]
    end

    # (l) (m) (n): the Celery task of examples/demo/celery_tasks.py, delivered by a real prefork
    # `celery worker` (examples/demo/celery_demo.py); its charges go to demo_charges.
    def celery_operations
      charges = ->(op) { Effects.charges(op.job_class.name, op.key) }
      [[112, "(l) celery: sent 3 times"], [113, "(m) celery: 5 copies at once"],
       [114, "(n) celery: child SIGKILLed"]].map do |number, scenario|
        Operation.new(scenario:, job_class: CELERY_TASK, key: order_id(number), effects: charges)
      end + [[115, "(o) sqs: received twice at once"], [116, "(p) sqs: consumer SIGKILLed"]].map do |number, scenario|
        Operation.new(scenario:, job_class: SQS_JOB, key: order_id(number), effects: charges)
      end
    end

    # (h) and (i): LedgerEntryJob, whose effect is written in its idempotent transaction.
    def ledger_operations
      [ledger_copies, ledger_crash]
    end

    # (h): several copies at once of one transactional operation.
    def ledger_copies
      ledger(109, "(h) 5 copies, 1 transaction")
    end

    # (i): a transactional operation whose first worker is SIGKILLed after its write, before commit.
    def ledger_crash
      ledger(110, "(i) killed before commit")
    end

    # (g): the operation held for a person.
    def email
      Operation.new(scenario: "(g) held, then resolved", job_class: EmailReceiptJob, key: order_id(108),
                    effects: ->(op) { Effects.emails(op.key).map { |row| row.fetch("pid").to_i } })
    end

    def email_address
      "buyer-#{order_id(108)}@example.com"
    end

    def ledger(number, scenario)
      Operation.new(scenario:, job_class: LedgerEntryJob, key: order_id(number),
                    effects: ->(op) { Effects.ledger(op.key) })
    end

    def shipment
      order = order_id(105)
      Operation.new(scenario: "(f) composite key", job_class: ShipParcelJob,
                    key: ShipParcelJob.demo_operation_key([{ "order_id" => order }, "ups"]),
                    effects: ->(_op) { Effects.shipments(order, "ups") })
    end
  end
end
