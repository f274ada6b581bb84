# frozen_string_literal: true

require "spec_helper"
require "securerandom"

RSpec.describe IdempotentJob::Transactional do
  let(:claim) do
    IdempotentJob::Claim.new(job_type: "RefundJob", operation_key: "9", token: SecureRandom.uuid, attempt: 1,
                             kind: :first, jid: "j")
  end

  it "picks a strategy per transaction flavour" do
    expect([nil, :native, :active_record].map { |f| described_class.for(f) })
      .to eq([described_class::Direct, described_class::Native, described_class::ActiveRecord])
  end

  it "raises the same LostClaimError, with job_type and operation_key, on the native and ActiveRecord paths" do
    errors = [described_class::Native, described_class::ActiveRecord].map do |strategy|
      strategy.within { |session| session.fenced(:complete, claim) }
    rescue IdempotentJob::LostClaimError => e
      e
    end
    expect(errors.map(&:class)).to eq([IdempotentJob::LostClaimError] * 2)
    expect(errors.map { |e| [e.job_type, e.operation_key] }).to eq([%w[RefundJob 9]] * 2)
    expect(errors.map(&:message).uniq.size).to eq(1)
  end

  it "raises PostgreSQL's errors on the ActiveRecord path as the gem's classes with their sqlstate" do
    IdempotentJob::Transactional::ActiveRecord.within do |session|
      request = { job_type: "RefundJob", operation_key: "9", lease: "not a number", args_digest: "d",
                  args_json: "[]", refuse_mismatch: false }
      expect { session.claim(request, 1) }.to raise_error(IdempotentJob::DatabaseError) { |e|
        expect(e.sqlstate).to eq("22P02")
        expect(e.retryable?).to be(false)
        expect(e.message).to start_with('RefundJob operation "9": ')
      }
      raise ActiveRecord::Rollback
    end
  rescue IdempotentJob::Error => e
    raise unless e.message.include?("rolled back")
  end

  it "raises a read-only server's answer (a failover in progress) as the native path does: retryable, 25006" do
    request = { job_type: "RefundJob", operation_key: "9", jid: "j", lease: 30.0, args_digest: "d", args_json: "[]",
                refuse_mismatch: false }
    claim = ->(strategy) { strategy.within { |session| session.claim(request, 1) } }
    SpecServices.configure_gem!(database_url: "#{SpecServices.database_url}" \
                                              "?options=-c%20default_transaction_read_only%3Don")
    ActiveRecord::Base.connection.execute("SET default_transaction_read_only = on")
    raised = [described_class::Native, described_class::ActiveRecord].map do |strategy|
      claim.call(strategy)
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
