# frozen_string_literal: true

# Seeds records in the states the operators' page shows, with the core's own
# statements ({RecordRows}).
module WebRecords
  def web_job_type(name = "WebSpecJob")
    "#{name}#{rand(1 << 30)}"
  end

  # A claim of `key` with the stored job a rerun re-enqueues.
  def web_claim(job_type, key, lease: 30, jid: "jid-#{key}", facts: nil)
    RecordRows.claim({ job_type:, operation_key: key, jid:, lease: lease.to_f, job_class: "WebSpecJob",
                       queue: "critical", args_json: JSON.generate([key]), args_digest: "d-#{key}",
                       facts_json: facts && JSON.generate(facts) })
  end

  # Held or given up as the protocol does it: by the delivery that took the stale claim
  # over, whose claim stored its job (what a rerun re-enqueues; a first claim stores none).
  # @param as [Symbol] :hold or :give_up
  def web_stopped(job_type, key, as: :hold)
    first = web_claim(job_type, key)
    RecordRows.fenced(:expire, job_type, key, first[:token], "stale")
    decision = web_claim(job_type, key)
    RecordRows.fenced(as, job_type, key, decision[:token])
    IdempotentJob.record(job_type, key)
  end

  # A claim whose lease ran out; `take_over: true` then lets a second delivery take it.
  def web_stale(job_type, key, take_over: false)
    web_claim(job_type, key, lease: 0.05, jid: "jid-dead")
    sleep 0.12
    web_claim(job_type, key, jid: "jid-taker") if take_over
    IdempotentJob.record(job_type, key)
  end

  # A completed operation enqueued by `producer`, then delivered `repeats` more times,
  # each a new enqueue by `again_by`.
  def web_repeated(job_type, key, repeats: 2, producer: "app/controllers/orders_controller.rb:42", again_by: producer)
    decision = web_claim(job_type, key, facts: { "jid" => "first-#{key}", "producer" => producer })
    RecordRows.fenced(:complete, job_type, key, decision[:token])
    repeats.times { |i| web_claim(job_type, key, facts: { "jid" => "again-#{key}-#{i}", "producer" => again_by }) }
  end
end

RSpec.configure { |config| config.include WebRecords }
