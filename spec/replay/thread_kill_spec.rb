# frozen_string_literal: true

require "spec_helper"

# Thread#kill skips `rescue`: cleanup that matters must be in `ensure`.
RSpec.describe "A job thread killed mid-body (Thread#kill)" do
  def kill_mid_body(job)
    inside = Queue.new
    SpecHooks.on(:after_effect) do
      inside << true
      sleep 30
    end
    runner = Thread.new do
      deliver(job)
    ensure
      ActiveRecord::Base.connection_handler.clear_active_connections!
    end
    inside.pop
    SpecHooks.reset! # a redelivery must not sleep in the hook too
    runner.kill.join
  end

  it "stops the heartbeat, so the dead job's lease runs out" do
    kill_mid_body(job_hash("idempotency_lease" => 0.6))
    sleep 1.0 # more than a lease: a heartbeat still running would have renewed it
    expect(record).to have_attributes(status: :claimed, lease_expired: true)
  end

  it "rolls a transactional job back at once instead of leaving its transaction open" do
    kill_mid_body(job_hash(["pay-kill", 1], klass: RecordPaymentJob))
    idle = Effects.connection.exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idempotent_job' " \
                                   "AND state LIKE 'idle in transaction%'").getvalue(0, 0).to_i
    expect(idle).to eq(0)
    deliver(job_hash(["pay-kill", 1], klass: RecordPaymentJob)) # not blocked by a leftover row lock
    expect(SpecPayment.rows("pay-kill")).to eq(1)
  end
end
