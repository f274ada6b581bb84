# frozen_string_literal: true

require "active_job"
require "active_job/queue_adapters/sidekiq_adapter"
require "idempotent_job/active_job"

ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(File::NULL)

# (j): the README's charge as an ActiveJob job on Sidekiq's ActiveJob adapter, worked by
# the demo's Sidekiq process: claimed once, under this class (never the adapter's wrapper).
class ChargeOrderActiveJob < ActiveJob::Base
  # Outermost (declared before the door's): counts the deliveries reaching the worker.
  around_perform do |job, block|
    Sidekiq.redis { |redis| redis.hincrby(Demo::ARRIVALS_KEY, "#{job.class.name} #{job.arguments.first}", 1) }
    block.call
  end
  include IdempotentJob::ActiveJob
  idempotency key: :order_id

  # Keyed as ChargeOrderJob is.
  def self.demo_operation_key(args) = ChargeOrderJob.demo_operation_key(args)

  def perform(order_id, amount_cents)
    sleep Demo::WORK_SECONDS
    Demo::Effects.charge(self.class.name, order_id, amount_cents)
  end
end

module Demo
  # The ActiveJob scenario of the demo: what the producer enqueues, and its table row.
  module ActiveJobScenario
    NUMBER = 112

    module_function

    # perform_later three times (new job_ids), and one job's message delivered twice
    # more (the same job_id), as a queue's redelivery would.
    def enqueue(state)
      order = state.order_id(NUMBER)
      3.times { ChargeOrderActiveJob.perform_later(order, 1800) }
      job = ChargeOrderActiveJob.new(order, 1800)
      2.times { ActiveJob::Base.queue_adapter.enqueue(job) }
      state.delivered(ChargeOrderActiveJob, order, 5)
      puts "(k) ChargeOrderActiveJob #{order}: ActiveJob on Sidekiq's adapter, perform_later 3 times " \
           "and one job_id delivered twice"
    end

    def operation(state)
      Operation.new(scenario: "(k) ActiveJob, 5 deliveries", job_class: ChargeOrderActiveJob,
                    key: state.order_id(NUMBER), effects: ->(op) { Effects.charges(op.job_class.name, op.key) })
    end
  end
end
