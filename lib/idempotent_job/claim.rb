# frozen_string_literal: true

module IdempotentJob
  # The claim a running job holds, readable inside `perform` through
  # {IdempotentJob.current_claim} or the {IdempotentJob::Job} helpers, e.g. to pass the
  # operation key to an outside system as its reference.
  #
  # Members: job_type (String), operation_key (String), token (String, the fencing
  # token), attempt (Integer, 1 for the first claim), kind (:first, :retry, :takeover),
  # jid (String, the delivering job's id).
  Claim = Struct.new(:job_type, :operation_key, :token, :attempt, :kind, :jid, keyword_init: true)
end
