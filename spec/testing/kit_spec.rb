# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/testing"

# Kit-only jobs: effects are rows in spec_effects (visible across threads and processes).
class KitChargeJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id

  def perform(order_id, amount_cents)
    Effects.record("kit-charge", "#{order_id}/#{amount_cents}")
  end
end

# The same with reject at enqueue: the kit replays deliveries, so its own pushes of a
# completed operation must reach the worker.
class KitSkipAtEnqueueJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_on_enqueue: :skip_completed

  def perform(order_id, amount_cents)
    Effects.record("kit-skip-at-enqueue", "#{order_id}/#{amount_cents}")
  end
end

# The same body with no operation key declared: not protected.
class KitUnprotectedJob
  include Sidekiq::Job

  def perform(order_id)
    Effects.record("kit-unprotected", order_id)
  end
end

# A key that does not tell operations apart (the currency, not the order).
class KitCoarseKeyJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :currency

  def perform(order_id, currency)
    Effects.record("kit-coarse", "#{order_id}/#{currency}")
  end
end

# Stale policies that do not rerun an operation whose worker died.
class KitHoldJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_on_stale: :hold

  def perform(order_id)
    Effects.record("kit-hold", order_id)
  end
end

class KitSkipJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_on_stale: :skip

  def perform(order_id)
    Effects.record("kit-skip", order_id)
  end
end

# A lookup that asks the effect table whether a dead worker's effect happened.
class KitLookupJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_lookup: :charged?

  def perform(order_id)
    Effects.record("kit-lookup", order_id)
  end

  def charged?(order_id)
    Effects.count(order_id).positive? ? :done : :not_done
  end
end

# An outside call in the middle of the body, then more work.
module KitGateway
  def self.charge(order_id)
    Effects.record("kit-gateway", order_id)
  end
end

class KitGatewayJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id

  def perform(order_id)
    KitGateway.charge(order_id)
    Effects.record("kit-receipt", order_id)
  end
end

# Broken in ways the kit must catch.
class KitLyingLookupJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_lookup: :charged?

  def perform(order_id)
    Effects.record("kit-lying", order_id)
  end

  def charged?(_order_id) = :not_done
end

class KitTooFineKeyJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: %i[order_id requested_at]

  def perform(order_id, requested_at)
    Effects.record("kit-fine", "#{order_id}@#{requested_at}")
  end
end

class KitRaisingJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, retry: false

  def perform(order_id)
    Effects.record("kit-raising", order_id)
    raise NotImplementedError, "after the effect"
  end
end

class KitFollowUpJob
  include Sidekiq::Job

  def perform(order_id) = Effects.record("kit-follow-up", order_id)
end

class KitEnqueuingJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id

  def perform(order_id)
    Effects.record("kit-enqueuing", order_id)
    KitFollowUpJob.perform_async(order_id)
  end
end

class KitNoHeartbeatJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_heartbeat: false

  def perform(order_id)
    sleep 1.3
    Effects.record("kit-no-heartbeat", order_id)
  end
end

RSpec.describe "The replay testing kit" do
  def effect_rows(job)
    Effects.connection.exec_params("SELECT count(*) FROM spec_effects WHERE job = $1", [job]).getvalue(0, 0).to_i
  end

  describe "on a protected job" do
    it "passes every delivery pattern, including two distinct operations" do
      expect(KitChargeJob).to be_idempotent_for(order_id: 42, amount_cents: 1500)
        .with_effect { effect_rows("kit-charge") }
        .and_distinct_from(order_id: 43, amount_cents: 1500)
    end

    it "reports what each delivery did" do
      replay = replay_job(KitChargeJob, 7, 100, effect: -> { effect_rows("kit-charge") })
      result = replay.concurrent(workers: 3, via: :threads)
      expect(result).to be_passed
      expect(result.deliveries.map(&:outcome).tally).to eq(ran: 1, deferred: 2, skipped: 2)
      expect(result.runs).to eq(1)
      expect(result.record.status).to eq(:completed)
      expect(result.to_s).to include("3 workers (threads) delivering the same arguments at once: ok")
    end

    it "allows the one repeat :reclaim permits after a kill after the effect, and says so" do
      result = replay_job(KitChargeJob, 8, 100, effect: -> { effect_rows("kit-charge") }).killed(after: :effect)
      expect(result).to be_passed
      expect(result.effects).to eq(2)
      expect(result.allowance).to include(":reclaim")
      expect(result.deliveries.map(&:outcome)).to eq(%i[killed deferred ran skipped])
    end

    it "passes under :hold and :skip, the killed operation ending held or given up, never lost" do
      expect(KitHoldJob).to be_idempotent_for(1).with_effect { effect_rows("kit-hold") }
                                                .in_scenarios(:repeated, :killed_after_effect)
      expect(KitSkipJob).to be_idempotent_for(1).with_effect { effect_rows("kit-skip") }
                                                .in_scenarios(:repeated, :killed_after_effect)
      held = replay_job(KitHoldJob, 2, effect: -> { effect_rows("kit-hold") }).killed(after: :claim)
      expect([held.effects, held.record.status]).to eq([0, :held])
      given_up = replay_job(KitSkipJob, 2, effect: -> { effect_rows("kit-skip") }).killed(after: :claim)
      expect([given_up.effects, given_up.record.status]).to eq([0, :given_up])
    end

    it "passes with a lookup that knows the effect happened: exactly once even after a kill after it" do
      result = replay_job(KitLookupJob, 5, effect: -> { effect_rows("kit-lookup") }).killed(after: :effect)
      expect([result.effects, result.deliveries.map(&:lookup).compact]).to eq([1, [:done]])
    end

    it "passes transactional jobs (native and ActiveRecord), whose killed effect rolls back" do
      expect(RecordPaymentJob).to be_idempotent_for(payment_id: "k1", cents: 5).with_effect { SpecPayment.rows("k1") }
      expect(RecordPaymentArJob).to be_idempotent_for("k2", 5).with_effect { SpecPayment.rows("k2") }
    end

    it "kills at a named method inside the body when told where the effect ends" do
      replay = replay_job(KitGatewayJob, 9, effect: -> { effect_rows("kit-gateway") }, effect_at: "KitGateway.charge")
      result = replay.killed(after: :effect)
      expect(result.observations.first).to eq("after the kill: effect 1 time(s), record claimed")
      expect(effect_rows("kit-receipt")).to eq(1) # only the rerun wrote one: the killed worker died before it
      expect(result.effects).to eq(2) # :reclaim's one allowed repeat
      expect(result).to be_passed
    end

    it "replays a job with on_enqueue: :skip_completed (its own pushes are deliveries, never dropped)" do
      expect(KitSkipAtEnqueueJob).to be_idempotent_for(12, 100).in_scenarios(:repeated, :killed_after_effect)
    end

    it "counts body runs when no effect block is given" do
      expect(KitChargeJob).to be_idempotent_for(11, 100).in_scenarios(:repeated, :concurrent_processes)
    end
  end

  describe "on an unprotected job" do
    it "fails every delivery pattern, saying which deliveries repeated the effect" do
      matcher = be_idempotent_for(order_id: 3).with_effect { effect_rows("kit-unprotected") }
      expect(matcher.matches?(KitUnprotectedJob)).to be(false)
      expect(matcher.results.map(&:scenario)).to eq(%i[repeated concurrent_threads concurrent_processes
                                                       killed_after_claim killed_after_effect])
      expect(matcher.results.map(&:passed?)).to all(be(false))
      message = matcher.failure_message
      expect(message).to include("5 of 5 delivery patterns repeated or lost its effect")
      expect(message).to include("the same arguments delivered 3 times in a row: FAILED (effect happened 3 time(s))")
      expect(message).to include("the body ran in delivery 1, delivery 2, delivery 3")
      expect(message).to include("the body ran in worker 1 (process), worker 2 (process), worker 3 (process)")
      expect(message).to include("a redelivery while the killed worker's lease was still live ran the body again")
      expect(KitUnprotectedJob).not_to be_idempotent_for(order_id: 3).in_scenarios(:repeated)
    end

    it "fails a protected job run with the gem disabled" do
      IdempotentJob::Testing.without_gem do
        matcher = be_idempotent_for(order_id: 42, amount_cents: 1).with_effect { effect_rows("kit-charge") }
        expect(matcher.matches?(KitChargeJob)).to be(false)
        expect(matcher.results.map(&:passed?)).to all(be(false))
        expect(matcher.failure_message).to include("with the gem DISABLED by IdempotentJob::Testing.without_gem")
      end
      expect(IdempotentJob::Testing.disabled?).to be(false)
    end

    it "fails an operation key that does not tell two operations apart" do
      matcher = be_idempotent_for(1, "EUR").with_effect { effect_rows("kit-coarse") }
                                           .and_distinct_from(2, "EUR").in_scenarios(:repeated, :distinct)
      expect(matcher.matches?(KitCoarseKeyJob)).to be(false)
      expect(matcher.results.map(&:passed?)).to eq([true, false])
      expect(matcher.failure_message).to include("the effect happened 1 time(s), expected 2; the body ran in " \
                                                 "operation 1 (the operation key does not tell these operations " \
                                                 "apart)")
    end
  end

  describe "on subtly broken jobs" do
    it "fails a lookup that answers :not_done after the effect happened, instead of blaming :reclaim" do
      result = replay_job(KitLyingLookupJob, 1, effect: -> { effect_rows("kit-lying") }).killed(after: :effect)
      expect(result).not_to be_passed
      expect(result.allowance).to be_nil
      expect(result.violations.first).to eq("the lookup #charged? answered :not_done although the killed worker's " \
                                            "effect had happened (effect 1 after the kill), so it was run again")
    end

    it "fails an operation key that includes an argument varying between deliveries of one operation" do
      matcher = be_idempotent_for(order_id: 1, requested_at: "10:00").with_effect { effect_rows("kit-fine") }
                                                                     .and_same_operation_as(order_id: 1,
                                                                                            requested_at: "10:05")
                                                                     .in_scenarios(:same_operation)
      expect(matcher.matches?(KitTooFineKeyJob)).to be(false)
      expect(matcher.failure_message).to include("the effect happened 2 time(s), expected once; the body ran in " \
                                                 "delivery 1, delivery 2 (other arguments) (the operation key tells")
      expect(KitChargeJob).to be_idempotent_for(1, 100).with_effect { effect_rows("kit-charge") }
                                                       .and_same_operation_as(1, 250).in_scenarios(:same_operation)
    end

    it "reports a body that raises before the kill point as a failed scenario, leaving no process behind" do
      matcher = be_idempotent_for(1).with_effect { effect_rows("kit-raising") }
      expect(matcher.matches?(KitRaisingJob)).to be(false)
      by_name = matcher.results.to_h { |r| [r.scenario, r] }
      expect(by_name[:killed_after_effect].violations.first)
        .to start_with("the worker meant to be SIGKILLed after its effect never got there: its delivery raised")
      expect(by_name[:repeated].violations.first).to include("it raised in delivery 1, delivery 2, delivery 3")
      expect { Process.waitpid(-1, Process::WNOHANG) }.to raise_error(Errno::ECHILD)
    end

    it "takes the jobs a body enqueues back out of the fake queues and reports them" do
      result = replay_job(KitEnqueuingJob, 4, effect: -> { effect_rows("kit-enqueuing") }).repeated(times: 3)
      expect(result).to be_passed
      expect(result.enqueued.map { |job| [job["class"], job["args"]] }).to eq([["KitFollowUpJob", [4]]])
      expect(result.to_s).to include('enqueued by the body: {"KitFollowUpJob"=>1}')
      expect(KitFollowUpJob.jobs).to be_empty
    end

    it "says the heartbeat is off when a body outlasts the kit's lease" do
      IdempotentJob::Testing.lease = 1.0
      result = replay_job(KitNoHeartbeatJob, 1, effect: -> { effect_rows("kit-no-heartbeat") }).killed(after: :effect)
      expect(result.violations.first).to include("idempotency_heartbeat is off")
    ensure
      IdempotentJob::Testing.lease = IdempotentJob::Testing::DEFAULT_LEASE
    end

    it "refuses scenarios asked for that cannot run, and never passes with no scenario" do
      expect { be_idempotent_for(1).in_scenarios(:distinct).matches?(KitUnprotectedJob) }
        .to raise_error(ArgumentError, /cannot run distinct/)
      threads_only = be_idempotent_for(1).with_effect { effect_rows("kit-unprotected") }
                                         .with_workers(2, via: :threads)
      expect(threads_only.matches?(KitUnprotectedJob)).to be(false)
      expect(threads_only.results.map(&:scenario)).to eq(%i[repeated concurrent_threads killed_after_claim
                                                            killed_after_effect])
    end
  end

  describe "with Sidekiq's testing modes" do
    it "works in inline mode and leaves it inline" do
      Sidekiq::Testing.inline! do
        expect(KitChargeJob).to be_idempotent_for(12, 1)
          .with_effect { effect_rows("kit-charge") }
          .in_scenarios(:repeated, :concurrent_threads, :killed_after_claim)
        expect(Sidekiq::Testing).to be_inline
      end
    end

    { inline!: :be_inline, fake!: :be_fake }.each do |mode, state|
      it "never sets a test mode itself, so it works inside a user's #{mode} block (7.2+ refuses nesting)" do
        Sidekiq::Testing.public_send(mode) do
          %i[fake! inline! disable!].each { |m| expect(Sidekiq::Testing).not_to receive(m) }
          expect(KitChargeJob).to be_idempotent_for(14, 1)
            .with_effect { effect_rows("kit-charge") }
            .in_scenarios(:repeated, :concurrent_threads)
          expect(Sidekiq::Testing).to send(state)
        end
      end
    end

    it "works in fake mode and leaves the suite's own queued jobs alone, adding none" do
      KitChargeJob.perform_async(99, 1)
      expect(KitChargeJob).to be_idempotent_for(13, 1)
        .with_effect { effect_rows("kit-charge") }
        .in_scenarios(:repeated, :concurrent_threads, :killed_after_claim)
      expect(KitChargeJob.jobs.map { |job| job["args"] }).to eq([[99, 1]])
      expect(Sidekiq::Testing).to be_fake
    end
  end

  describe "arguments and records" do
    it "maps named arguments to perform's parameters and names what is wrong" do
      expect(IdempotentJob::Testing::Arguments.positional(KitChargeJob, amount_cents: 5, order_id: 1)).to eq([1, 5])
      expect { IdempotentJob::Testing::Arguments.positional(KitChargeJob, order_id: 1) }
        .to raise_error(ArgumentError, "KitChargeJob#perform needs amount_cents; given order_id")
      expect { IdempotentJob::Testing::Arguments.positional(KitChargeJob, order: 1) }
        .to raise_error(ArgumentError, "KitChargeJob#perform has no parameter order")
      expect { replay_job(KitGatewayJob, 1, effect_at: "KitGateway.refund") }
        .to raise_error(ArgumentError, "effect_at: KitGateway.refund is not a method")
    end

    it "deletes records for one job type or all" do
      claim("KitA", "1", "j", 30)
      claim("KitB", "1", "j", 30)
      expect(IdempotentJob::Testing.clean_records!("KitA")).to eq(1)
      expect([record("1", job_type: "KitA"), record("1", job_type: "KitB")&.status]).to eq([nil, :claimed])
      expect(IdempotentJob::Testing.clean_records!).to be >= 1
      expect(record("1", job_type: "KitB")).to be_nil
    end
  end
end
