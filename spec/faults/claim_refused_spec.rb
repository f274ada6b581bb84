# frozen_string_literal: true

require "spec_helper"

# A worker whose URL the server refuses: a wrong password (28P01: bin/services makes the
# role idempotent_job_password_probe give one), a role that does not exist (28000), a
# database that does not exist (3D000). The delivery's error names its job and operation,
# as a missing table's does, keeps its class (DatabaseError, not retryable, sent back to its
# queue), never shows the password, and the block does not run.
# python/tests/test_claim_refused.py asserts the same of the Python door.
RSpec.describe "a claim the server refuses to connect" do
  probe = "idempotent_job_password_probe"
  base = ENV.fetch("DATABASE_URL")

  def self.with_user(url, user)
    url.sub(%r{://[^@/]*@}, "://#{user}@")
  end

  urls = {
    "28P01" => with_user(base, "#{probe}:wrong-secret"),
    "28000" => with_user(base, "no_such_role_here"),
    "3D000" => base.sub(%r{/[^/?]+(\?|\z)}, "/no_such_database_here\\1")
  }

  before(:all) do
    Effects.connection.exec("SET password_encryption = 'scram-sha-256'")
    Effects.connection.exec("CREATE ROLE #{probe} LOGIN PASSWORD 'right'")
  rescue PG::DuplicateObject
    nil
  end

  after { SpecServices.configure_gem! }

  urls.each do |state, url|
    { "the pool" => {}, "the gem's transaction" => { transaction: true } }.each do |channel, options|
      it "names the job and the operation (#{state}, through #{channel})" do
        SpecServices.configure_gem!(database_url: url, deadline: 5)
        key = "order-#{rand(1 << 40)}"
        ran = []
        error = begin
          IdempotentJob.perform_once("ClaimRefusedJob", key, **options) { ran << 1 }
        rescue IdempotentJob::Error => e
          e
        end
        if state == "28P01" && error.is_a?(IdempotentJob::DatabaseError) && error.sqlstate == "28000"
          skip "this server does not ask #{probe} for a password (bin/services' pg_hba line)"
        end
        expect(error).to be_a(IdempotentJob::DatabaseError)
        expect(error.sqlstate).to eq(state)
        expect(error.message).to start_with(%(cannot claim ClaimRefusedJob operation "#{key}": ))
        expect(error.message.scan("cannot claim").size).to eq(1)
        expect(error.message).to include("check database_url")
        expect(error.message).not_to include("wrong-secret")
        expect(error).not_to be_retryable
        expect(error).to be_sends_back
        expect(ran).to be_empty
      end
    end
  end
end
