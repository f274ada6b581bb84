# frozen_string_literal: true

# Jobs of spec/faults/probe_spec.rb.

# A job whose arguments are free-form text.
class NoteJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :note_id

  def perform(note_id, text, _extra = nil)
    Effects.record("NoteJob", "#{note_id}:#{text.count("\u0000")}")
  end
end

# Blocks the network from inside the body for longer than two renewal intervals.
class DoubtfulJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :id, idempotency_lease: 1.5

  def perform(id)
    before = idempotency_claim.in_doubt?
    SpecHooks.call(:cut)
    sleep 2.2
    SpecHooks.call(:seen, before, idempotency_claim.in_doubt?)
    SpecHooks.call(:heal)
    Effects.record("DoubtfulJob", id)
  end
end
