# frozen_string_literal: true

require "spec_helper"

# A worker dies holding a claim (a real process, SIGKILL), before or after its effect;
# the lease runs out; the next delivery finds a stale claim. What happens then is the
# policy chosen in advance, informed by an outside lookup where the job has one.
RSpec.describe "Stale claims" do
  let(:lease) { 1.0 }

  def stale_after(point, job)
    kill_worker_at(point, job)
    wait_for_lease_end(lease)
  end

  describe "the stale policy" do
    expectations = {
      # policy => { died at => [effects after the redeliveries, status, held?] }
      reclaim: { before_effect: [1, :completed], after_effect: [2, :completed] },
      hold: { before_effect: [0, :held], after_effect: [1, :held] },
      skip: { before_effect: [0, :given_up], after_effect: [1, :given_up] }
    }
    expectations.each do |policy, cases|
      cases.each do |point, (effects, status)|
        it ":#{policy}, worker SIGKILLed at #{point}: #{effects} effect(s), record #{status}" do
          job = job_hash("idempotency_lease" => lease, "idempotency_on_stale" => policy.to_s)
          stale_after(point, job)
          2.times { deliver(job) }
          expect(Effects.count(42)).to eq(effects)
          expect(record).to have_attributes(status:, attempts: 2, takeovers: 1)
          expect(IdempotentJob.held.map(&:operation_key)).to eq(status == :held ? ["42"] : [])
          expect(record.duplicates).to eq(1) # the second redelivery was turned away
        end
      end
    end

    it "defaults to :reclaim, configurable globally" do
      SpecServices.configure_gem!(on_stale: :skip)
      job = job_hash("idempotency_lease" => lease)
      stale_after(:before_effect, job)
      deliver(job)
      expect(record).to have_attributes(status: :given_up)
      expect(IdempotentJob::Configuration.new.on_stale).to eq(:reclaim)
    end

    it "rejects an unknown policy naming the job" do
      expect { ChargeOrderJob.set(idempotency_on_stale: :retry).perform_async(1, 1) }
        .to raise_error(IdempotentJob::ConfigurationError, /ChargeOrderJob: idempotency_on_stale must be one of/)
    end
  end

  describe "an outside lookup" do
    def stale_capture(policy: "hold")
      job = job_hash(["pay-1"], klass: CapturePaymentJob, "idempotency_lease" => lease,
                                "idempotency_on_stale" => policy)
      stale_after(:before_effect, job)
      job
    end

    def capture_record
      record("pay-1", job_type: "CapturePaymentJob")
    end

    it ":done marks the operation completed without running it" do
      job = stale_capture
      SpecHooks.on(:lookup) { |key| key == "pay-1" ? :done : :unknown }
      deliver(job)
      expect(Effects.count("pay-1")).to eq(0)
      expect(capture_record).to have_attributes(status: :completed, attempts: 2)
    end

    it ":not_done runs the job again even under :hold" do
      job = stale_capture
      SpecHooks.on(:lookup) { :not_done }
      deliver(job)
      expect(Effects.count("pay-1")).to eq(1)
      expect(capture_record).to have_attributes(status: :completed)
    end

    it ":unknown leaves the decision to the policy" do
      job = stale_capture(policy: "skip")
      SpecHooks.on(:lookup) { "unknown" }
      deliver(job)
      expect(Effects.count("pay-1")).to eq(0)
      expect(capture_record).to have_attributes(status: :given_up)
    end

    it "raising never runs the body: the claim stays stale and the next delivery asks again" do
      job = stale_capture(policy: "reclaim")
      SpecHooks.on(:lookup) { raise IOError, "gateway timeout" }
      expect { deliver(job) }.to raise_error(IdempotentJob::LookupError, /raised IOError: gateway timeout/) do |e|
        expect(e.cause).to be_a(IOError)
      end
      expect(Effects.count("pay-1")).to eq(0)
      expect(capture_record).to have_attributes(status: :claimed, lease_expired: true)
      expect(capture_record.last_error).to include("lookup failed: IOError")

      SpecHooks.on(:lookup) { :not_done } # the retry asks again
      deliver(job)
      expect(Effects.count("pay-1")).to eq(1)
      expect(capture_record).to have_attributes(status: :completed, attempts: 3)
    end

    it "an answer outside :done, :not_done, :unknown is an error too" do
      job = stale_capture
      SpecHooks.on(:lookup) { true }
      expect { deliver(job) }.to raise_error(IdempotentJob::LookupError, /answered true/)
      expect(Effects.count("pay-1")).to eq(0)
    end

    it "must name a method of the job" do
      expect { CapturePaymentJob.set(idempotency_lookup: :nope?).perform_async("p") }
        .to raise_error(IdempotentJob::ConfigurationError, /does not define/)
    end
  end

  describe "two deliveries racing for one stale claim" do
    it "let exactly one take it over" do
      job = job_hash("idempotency_lease" => lease)
      stale_after(:before_effect, job)
      SpecHooks.on(:after_effect) { sleep 0.3 }
      gate = Queue.new
      threads = 4.times.map do
        Thread.new do
          gate.pop
          deliver(job)
        end
      end
      4.times { gate << true }
      threads.each(&:join)
      expect(Effects.count(42)).to eq(1)
      expect(record).to have_attributes(status: :completed, attempts: 2, takeovers: 1)
    end
  end

  describe "a stalled holder that wakes after a takeover" do
    it "cannot complete the new claim: LostClaimError, and the taker's completion stands" do
      job = job_hash("idempotency_lease" => 0.5, "idempotency_heartbeat" => false)
      stalled = stalled_holder_overtaken(job, stall: 0.7) # the holder's lease runs out while it is stalled
      expect { stalled.join }.to raise_error(IdempotentJob::LostClaimError)
      expect(record).to have_attributes(status: :completed, attempts: 2)
      expect(Effects.count(42)).to eq(2) # the documented cost of a lease shorter than the job
    end
  end

  describe "the lease heartbeat" do
    it "keeps a job running three times its lease from being taken over" do
      started = Queue.new
      SpecHooks.on(:after_effect) do
        started << true
        sleep 3 * lease
      end
      job = job_hash("idempotency_lease" => lease)
      runner = Thread.new { deliver(job) }
      started.pop
      sleep 2 * lease
      deliver(job) # a duplicate while the first still runs: deferred, not run
      runner.join
      expect(Effects.count(42)).to eq(1)
      expect(ChargeOrderJob.jobs.size).to eq(1)
      expect(record).to have_attributes(status: :completed, attempts: 1, takeovers: 0)
      expect(record.heartbeat_at).not_to be_nil
    end

    it "lets a SIGKILLed holder's claim be taken over within about one lease of its death" do
      job = job_hash("idempotency_lease" => lease)
      kill_worker_at(:after_effect, job)
      killed_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      sleep 0.05 until record.lease_expired
      waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - killed_at
      expect(waited).to be <= lease + 0.3
      deliver(job)
      expect(record).to have_attributes(takeovers: 1)
    end
  end

  describe "a payload mismatch (same operation key, different arguments)" do
    it "is reported and the duplicate skipped by default" do
      log = StringIO.new
      SpecServices.configure_gem!(logger: Logger.new(log))
      deliver(job_hash([42, 1500]))
      deliver(job_hash([42, 9999]))
      expect(Effects.count(42)).to eq(1)
      expect(log.string).to include("different payload")
      expect(record).to have_attributes(mismatches: 1, last_mismatch: true)
    end

    it "is refused with PayloadMismatchError under idempotency_on_mismatch: :raise" do
      deliver(job_hash([42, 1500]))
      expect { deliver(job_hash([42, 9999], "idempotency_on_mismatch" => "raise")) }
        .to raise_error(IdempotentJob::PayloadMismatchError, /ChargeOrderJob operation "42"/)
      expect(Effects.count(42)).to eq(1)
    end

    it "under :raise never takes over a stale claim" do
      job = job_hash([42, 1500], "idempotency_lease" => lease)
      stale_after(:before_effect, job)
      other = job_hash([42, 9999], "idempotency_on_mismatch" => "raise")
      expect { deliver(other) }.to raise_error(IdempotentJob::PayloadMismatchError)
      expect(record).to have_attributes(status: :claimed, attempts: 1)
    end
  end

  describe "held operations" do
    def hold_one
      job = job_hash("idempotency_lease" => lease, "idempotency_on_stale" => "hold")
      stale_after(:before_effect, job)
      deliver(job)
      job
    end

    it "are listed with job type, key, since, attempts and last jid; later deliveries are counted" do
      job = hold_one
      deliver(job)
      held = IdempotentJob.held
      expect(held.size).to eq(1)
      expect(held.first).to have_attributes(job_type: "ChargeOrderJob", operation_key: "42", attempts: 2,
                                            jid: job["jid"], duplicates: 1)
      expect(held.first.held_at).to be_within(5).of(Time.now)
      expect(IdempotentJob.held(job_type: "Other")).to eq([])
    end

    it "resolve as: :done marks it completed" do
      job = hold_one
      expect(IdempotentJob.resolve("ChargeOrderJob", 42, as: :done)).to have_attributes(status: :completed,
                                                                                        resolution: "done")
      deliver(job)
      expect(Effects.count(42)).to eq(0)
    end

    it "resolve as: :rerun re-enqueues the stored arguments, which run once" do
      hold_one
      ChargeOrderJob.jobs.clear
      IdempotentJob.resolve("ChargeOrderJob", "42", as: :rerun)
      expect(ChargeOrderJob.jobs.map { |j| j["args"] }).to eq([[42, 1500]])
      ChargeOrderJob.drain
      ChargeOrderJob.perform_async(42, 1500)
      ChargeOrderJob.drain
      expect(Effects.count(42)).to eq(1)
      expect(record).to have_attributes(status: :completed, last_claim: :retry, resolution: "rerun")
    end

    it "resolve refuses an operation that is not held" do
      deliver(job_hash)
      expect { IdempotentJob.resolve("ChargeOrderJob", "42", as: :done) }
        .to raise_error(IdempotentJob::Error, /not held or given up \(status: :completed\)/)
      expect { IdempotentJob.resolve("ChargeOrderJob", "42", as: :maybe) }
        .to raise_error(IdempotentJob::ConfigurationError)
    end

    # A record held by hand (no takeover stored its job): the rerun is refused before
    # anything is sent, the record stays held, and resolving it as done still works.
    it "resolve refuses a rerun of a record with no stored job, naming the operation" do
      first = claim("ChargeOrderJob", "43", "jid-43", 30, job_class: "ChargeOrderJob", queue: "default",
                                                          args_json: "[43,1500]", args_digest: "d")
      RecordRows.fenced(:hold, "ChargeOrderJob", "43", first[:token])
      sent = []
      IdempotentJob.on_rerun { |r| sent << r }
      ChargeOrderJob.jobs.clear
      expect { IdempotentJob.resolve("ChargeOrderJob", 43, as: :rerun) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /\Acannot rerun ChargeOrderJob operation "43": the record \(held\) holds no stored job/)
      expect([sent, ChargeOrderJob.jobs]).to eq([[], []])
      expect(record("43")).to have_attributes(status: :held, resolution: nil, job_class: nil, args: nil)
      expect(IdempotentJob.resolve("ChargeOrderJob", 43, as: :done)).to have_attributes(status: :completed)
    ensure
      IdempotentJob.instance_variable_set(:@rerun_senders, [])
    end
  end

  describe "inside perform" do
    it "the job reads its operation key, attempt and claim" do
      seen = nil
      SpecHooks.on(:inside) do |job|
        seen = [job.idempotency_key, job.idempotency_attempt, job.idempotency_claim.kind, IdempotentJob.current_claim]
      end
      job = job_hash
      deliver(job)
      expect(seen[0..2]).to eq(["42", 1, :first])
      expect(seen[3]).to have_attributes(job_type: "ChargeOrderJob", operation_key: "42")
      expect(seen[3].delivery_id).to eq(job["jid"]).and eq(seen[3].jid)
      expect(IdempotentJob.current_claim).to be_nil
    end
  end
end
