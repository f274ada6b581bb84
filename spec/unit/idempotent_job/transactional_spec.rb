# frozen_string_literal: true

require "spec_helper"
require "securerandom"

# The transactional strategies' errors, through the public one-call API
# (`perform_once(transaction: true)` and `transaction: :active_record`).
RSpec.describe IdempotentJob::Transactional do
  let(:uuid) { /\h{8}-\h{4}-\h{4}-\h{4}-\h{12}/ }

  it "picks a strategy per transaction flavour" do
    expect([nil, :native, :active_record].map { |f| described_class.for(f) })
      .to eq([described_class::Direct, described_class::Native, described_class::ActiveRecord])
  end

  it "raises the same LostClaimError, with job_type and operation_key, on the native and ActiveRecord paths" do
    # The body replaces its own claim's token in the same transaction: the completion's
    # fenced statement then finds the claim no longer held.
    steal = "UPDATE idempotent_job_records SET claim_token = gen_random_uuid() " \
            "WHERE job_type = 'RefundJob' AND operation_key = $1"
    bodies = {
      true => ->(key) { IdempotentJob.current_transaction.exec(steal, [key]) },
      active_record: ->(key) { ActiveRecord::Base.connection.raw_connection.exec_params(steal, [key]) }
    }
    errors = bodies.map do |flavour, body|
      key = "9-#{SecureRandom.hex(4)}"
      IdempotentJob.perform_once("RefundJob", key, transaction: flavour) { body.call(key) }
    rescue IdempotentJob::LostClaimError => e
      e
    end
    expect(errors.map(&:class)).to eq([IdempotentJob::LostClaimError] * 2)
    expect(errors.map { |e| [e.job_type, e.operation_key.sub(/-\h+\z/, "")] }).to eq([%w[RefundJob 9]] * 2)
    expect(errors.map { |e| e.message.gsub(uuid, "TOKEN").gsub(/"9-\h+"/, '"9"') }.uniq.size).to eq(1)
  end

  it "raises PostgreSQL's errors on the ActiveRecord path as the gem's classes with their sqlstate" do
    ActiveRecord::Base.transaction do
      # The claim statement cannot find the table on this search_path: 42P01.
      ActiveRecord::Base.connection.execute("SET LOCAL search_path TO pg_catalog")
      expect { IdempotentJob.perform_once("RefundJob", "9", transaction: :active_record) { :ran } }
        .to raise_error(IdempotentJob::DatabaseError) { |e|
          expect(e.sqlstate).to eq("42P01")
          expect(e.retryable?).to be(false)
          expect(e.message).to start_with('RefundJob operation "9": ')
        }
      raise ActiveRecord::Rollback
    end
  end

  it "raises a read-only server's answer (a failover in progress) as the native path does: retryable, 25006" do
    SpecServices.configure_gem!(database_url: "#{SpecServices.database_url}" \
                                              "?options=-c%20default_transaction_read_only%3Don")
    ActiveRecord::Base.connection.execute("SET default_transaction_read_only = on")
    raised = [true, :active_record].map do |flavour|
      IdempotentJob.perform_once("RefundJob", "9", transaction: flavour) { :ran }
    rescue IdempotentJob::Error => e
      e
    end
    expect(raised.map(&:class)).to eq([IdempotentJob::DatabaseError] * 2)
    expect(raised.map(&:sqlstate)).to eq(%w[25006] * 2)
    expect(raised.map(&:retryable?)).to eq([true, true])
    expect(raised.last.message).to start_with('RefundJob operation "9": ').and include("read-only")
  ensure
    ActiveRecord::Base.connection.execute("RESET default_transaction_read_only")
  end
end
