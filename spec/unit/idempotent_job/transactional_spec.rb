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
        expect(e.message).to start_with('RefundJob operation "9": ')
      }
      raise ActiveRecord::Rollback
    end
  rescue IdempotentJob::Error => e
    raise unless e.message.include?("rolled back")
  end
end
