# frozen_string_literal: true

require "active_record"
require "active_job"
require "global_id"
require "idempotent_job/active_job"

# The ActiveJob spec jobs, loaded by the RSpec process and by the real worker
# processes (Sidekiq's ActiveJob adapter, Delayed Job). Each protected job has an
# unprotected twin with the same body and no `include IdempotentJob::ActiveJob`: the
# control runs that show the duplicates do happen without the gem.
ActiveJob::Base.logger = Logger.new(File::NULL)
GlobalID.app = "idempotent-job-spec"

# A GlobalID-able model: an argument of this class keys by its GlobalID.
class SpecOrder < ActiveRecord::Base
  include GlobalID::Identification
  self.table_name = "spec_orders"

  def self.setup!
    connection.execute("CREATE TABLE IF NOT EXISTS spec_orders (id bigserial PRIMARY KEY, number text NOT NULL)")
  end
end

# The job bodies, and the stop points a real worker process (which the spec cannot
# reach with SpecHooks) takes from its environment: SPEC_STOP_AT names the point,
# SPEC_MARKER a file created when the worker gets there (only the first worker that
# gets there stops, so a redelivery after the kill runs through).
module AjSpecBody
  class << self
    # @param job [ActiveJob::Base] the running job
    # @param operation [Object] what the effect row names
    # @param hold [Numeric] seconds the body lingers after its effect (overlapping copies)
    def run(job, operation, hold)
      SpecHooks.call(:inside, job)
      point(:before_effect, operation)
      Effects.record(job.class.name, operation)
      point(:after_effect, operation)
      sleep(hold.to_f) if hold.to_f.positive?
    end

    private

    def point(name, operation)
      SpecHooks.call(name, operation)
      return unless ENV["SPEC_STOP_AT"] == name.to_s && ENV["SPEC_MARKER"]

      begin
        File.open(ENV.fetch("SPEC_MARKER"), File::WRONLY | File::CREAT | File::EXCL) { |f| f.write(Process.pid) }
      rescue Errno::EEXIST
        return
      end
      sleep 60
    end
  end
end

# The README's example on ActiveJob (short lease, so crash scenarios take seconds).
class AjChargeOrderJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :order_id, lease: 2

  def perform(order_id, _cents, hold = 0)
    AjSpecBody.run(self, order_id, hold)
  end
end

# The control: the same job without the gem.
class AjChargeOrderUnprotectedJob < ActiveJob::Base
  def perform(order_id, _cents, hold = 0)
    AjSpecBody.run(self, order_id, hold)
  end
end

# Keyed by a GlobalID-able argument and a name: a composite key.
class AjShipOrderJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: %i[order carrier], lease: 2, scope: "aj-shipping"

  def perform(order, carrier)
    AjSpecBody.run(self, "#{order.number}/#{carrier}", 0)
  end
end

# The same operation under the :hold stale policy: a worker that died after its
# effect leaves the operation for a person instead of running it again.
class AjRefundOrderJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :order_id, lease: 2, on_stale: :hold

  def perform(order_id, _cents, hold = 0)
    AjSpecBody.run(self, order_id, hold)
  end
end

class SpecDeclinedError < StandardError; end

# retry_on's own attempts, to show the door's deferrals do not use them up.
class AjRetryingJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :order_id, lease: 2
  retry_on SpecDeclinedError, attempts: 2, wait: 5

  def perform(order_id)
    SpecHooks.call(:inside, self)
    Effects.record("retrying", order_id)
    SpecHooks.call(:after_effect, order_id)
  end
end

# Transactional mode: the body's write, the claim and the completion commit together,
# in ActiveRecord's transaction...
class AjRecordPaymentJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :payment_id, lease: 2, transaction: :active_record

  def perform(payment_id, cents)
    SpecHooks.call(:before_effect, payment_id)
    SpecPayment.create!(payment_id:, cents:, pid: Process.pid)
    SpecHooks.call(:after_effect, payment_id)
  end
end

# ...or in the gem's own transaction handle (`idempotent_transaction`; without the gem,
# as the control runs, the same code writes directly).
class AjRecordPaymentNativeJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :payment_id, lease: 2, transaction: true

  def perform(payment_id, cents)
    sql = "INSERT INTO spec_payments (payment_id, cents, pid) VALUES ($1, $2, $3)"
    params = [payment_id, cents, Process.pid]
    idempotent_transaction ? idempotent_transaction.exec(sql, params) : Effects.connection.exec_params(sql, params)
    SpecHooks.call(:after_effect, payment_id)
  end
end
