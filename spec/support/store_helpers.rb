# frozen_string_literal: true

# Shorthands for driving the native store directly in specs.
module StoreHelpers
  def claim(job_type, key, jid, lease, **extra)
    IdempotentJob.store.claim({ job_type:, operation_key: key, jid:, lease: lease.to_f, **extra })
  end

  def complete(job_type, key, token)
    IdempotentJob.store.fenced(:complete, job_type, key, token, nil)
  end
end

RSpec.configure { |config| config.include StoreHelpers }
