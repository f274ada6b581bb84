# frozen_string_literal: true

require "active_record"

ActiveRecord::Base.logger = nil

# The effect of the transactional spec jobs: rows in spec_payments, written in the
# job's idempotent transaction (native handle or ActiveRecord model).
class SpecPayment < ActiveRecord::Base
  self.table_name = "spec_payments"

  def self.setup!
    ActiveRecord::Base.establish_connection(SpecServices.active_record_url)
    ActiveRecord::Base.connection.execute(<<~SQL)
      CREATE TABLE IF NOT EXISTS spec_payments (
        id bigserial PRIMARY KEY, payment_id text NOT NULL, cents integer NOT NULL,
        pid integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())
    SQL
  end

  # @return [Integer] rows for one payment
  def self.rows(payment_id)
    Effects.connection.exec_params("SELECT count(*) FROM spec_payments WHERE payment_id = $1", [payment_id.to_s])
           .getvalue(0, 0).to_i
  end
end

# Writes through the job's idempotent transaction; without the middleware (the
# control runs) it writes directly, as the same code would without the gem.
class RecordPaymentJob
  include Sidekiq::Job
  include IdempotentJob::Job
  sidekiq_options idempotency_key: :payment_id, idempotency_transaction: true

  def perform(payment_id, cents)
    SpecHooks.call(:before_effect, payment_id)
    sql = "INSERT INTO spec_payments (payment_id, cents, pid) VALUES ($1, $2, $3)"
    if idempotent_transaction
      idempotent_transaction.exec(sql, [payment_id, cents, Process.pid])
    else
      Effects.connection.exec_params(sql, [payment_id, cents, Process.pid])
    end
    SpecHooks.call(:after_effect, payment_id)
  end
end

# The same with ActiveRecord models in ActiveRecord's own transaction.
class RecordPaymentArJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :payment_id, idempotency_transaction: :active_record

  def perform(payment_id, cents)
    SpecHooks.call(:before_effect, payment_id)
    SpecPayment.create!(payment_id:, cents:, pid: Process.pid)
    SpecHooks.call(:after_effect, payment_id)
  end
end
