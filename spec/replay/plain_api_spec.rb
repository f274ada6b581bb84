# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/testing"

# The plain Ruby door: IdempotentJob.perform_once, the protocol without a queue.
RSpec.describe "IdempotentJob.perform_once (plain Ruby door)" do
  def charge(order_id = 42, cents = 1500, **options, &body)
    IdempotentJob.perform_once("PlainCharge", order_id, lease: 30, payload: [order_id, cents], **options,
                               &(body || proc { Effects.record("plain", order_id) }))
  end

  it "runs the block once and returns its value; later calls are :completed and do not run it" do
    first = charge { |claim| Effects.record("plain", 42) && "charged #{claim.operation_key}" }
    expect(first).to have_attributes(ran?: true, decision: :ran, value: "charged 42", retry_after: nil)
    expect(first.claim).to have_attributes(job_type: "PlainCharge", operation_key: "42", attempt: 1, kind: :first)
    again = charge
    expect(again).to have_attributes(ran?: false, decision: :completed, value: nil, duplicates: 1)
    expect(Effects.count(42)).to eq(1)
    # No delivery took it over, so no job is stored (a rerun needs one only after a takeover).
    expect(IdempotentJob.record("PlainCharge", 42)).to have_attributes(status: :completed, args: nil,
                                                                       job_class: nil)
  end

  it "releases the claim when the block raises and re-raises; the next call claims it again as a retry" do
    expect { charge { raise ArgumentError, "gateway down" } }.to raise_error(ArgumentError, "gateway down")
    expect(IdempotentJob.record("PlainCharge", 42)).to have_attributes(status: :released)
    retried = charge(&:attempt)
    expect(retried).to have_attributes(decision: :ran, value: 2)
    expect(retried.claim.kind).to eq(:retry)
  end

  it "keeps the claim when the block is interrupted (Interrupt, SignalException): a crash, not a failure" do
    # Ctrl-C or SIGTERM in a consumer mid-charge: the effect may have happened, so the
    # lease and the stale policy decide, as for a Sidekiq or ActiveJob worker's shutdown.
    expect { charge { raise Interrupt } }.to raise_error(Interrupt)
    expect(IdempotentJob.record("PlainCharge", 42)).to have_attributes(status: :claimed, last_error: nil)
    expect { charge(43) { raise SignalException, "TERM" } }.to raise_error(SignalException)
    expect(IdempotentJob.record("PlainCharge", 43)).to have_attributes(status: :claimed)
  end

  it "answers :in_progress while another call holds a live claim, with a short retry_after bounded by the lease" do
    holding = Queue.new
    finish = Queue.new
    holder = Thread.new do
      charge do
        holding << true
        finish.pop
        Effects.record("plain", 42)
      end
    end
    holding.pop
    first = charge
    later = charge(deferrals: 3)
    late = charge(deferrals: 12)
    finish << true
    holder.join
    expect(first).to have_attributes(decision: :in_progress, ran?: false)
    expect(first.lease_remaining).to be_within(2).of(30)
    expect(first.retry_after).to eq(1.0) # first back-off step, not the 30 s lease
    expect(later.retry_after).to eq(8.0)
    expect(late.retry_after).to be_within(2).of(31) # never past the lease end + defer_margin
    expect(first.holder).to be_a(String)
    expect(charge.decision).to eq(:completed)
    expect(Effects.count(42)).to eq(1)
  end

  it "passes the delivery's facts to the claim request as facts_json, keeping the request's keys" do
    requests = []
    # The core protocol's one call takes the claim request (see Protocol::Driver).
    allow_any_instance_of(IdempotentJob::Native::Protocol).to(
      receive(:perform).and_wrap_original do |perform, store, channel, request, *rest|
        (requests << request) && perform.call(store, channel, request, *rest)
      end
    )
    charge(facts: { receive_count: 2 }, id: "message-1")
    # The payload and the facts go as they are: the core writes their JSON (stored: see below).
    expect(requests.first).to include(job_type: "PlainCharge", operation_key: "42", jid: "message-1",
                                      payload: [42, 1500], facts: { "receive_count" => 2 })
  end

  it "stores the facts as given: Float timestamps, nested values, a Bignum (JSON.generate's fallback); refuses NaN" do
    facts = { "enqueued_at" => 1_764_651_234.123456, "retry_count" => 0, "producer" => { "app" => "shop" },
              "tags" => ["a", nil, true], "big" => 2**70, "note" => "é \" \\ \n" }
    charge(7, facts:)
    conn = PG.connect(SpecServices.database_url)
    stored = conn.exec_params("SELECT first_facts::text FROM idempotent_job_records WHERE job_type = $1 AND " \
                              "operation_key = $2", %w[PlainCharge 7]).getvalue(0, 0)
    expect(JSON.parse(stored)).to eq(facts)
    expect(IdempotentJob::Delivery.new(job_type: "T", operation_key: "1", facts: { "at" => 1.5 }).facts_json)
      .to eq('{"at":1.5}')
    expect { charge(8, facts: { "at" => Float::NAN }) }
      .to raise_error(IdempotentJob::ConfigurationError, /PlainCharge: the facts cannot be written as JSON.*NaN/)
  ensure
    conn&.close
  end

  it "a held plain operation resolved for a rerun is released (no door enqueues it) and runs at the next call" do
    holder = Thread.new do # outlives its unrenewed lease: the next call finds a stale claim
      IdempotentJob.perform_once("PlainHeld", 5, lease: 0.3, heartbeat: false, on_stale: :hold) { sleep 1 }
    rescue IdempotentJob::LostClaimError => e
      e
    end
    sleep 0.6
    expect(IdempotentJob.perform_once("PlainHeld", 5, lease: 0.3, on_stale: :hold) { :no }.decision).to eq(:held)
    expect(holder.value).to be_a(IdempotentJob::LostClaimError)
    IdempotentJob.resolve("PlainHeld", 5, as: :rerun)
    expect(IdempotentJob.record("PlainHeld", 5)).to have_attributes(status: :released, resolution: "rerun")
    # The Sidekiq door is loaded here too: it must not push a job named "PlainHeld"
    # (no such class; a worker would only fail it through every retry).
    expect(Sidekiq::Queues.jobs_by_queue.values.flatten).to be_empty
    expect(IdempotentJob.perform_once("PlainHeld", 5, lease: 0.3) { :ran }).to have_attributes(value: :ran)
  end

  it "a held plain operation resolved for a rerun goes to the sender registered with on_rerun" do
    holder = Thread.new do # outlives its unrenewed lease: the next call finds a stale claim
      IdempotentJob.perform_once("PlainRerun", 6, lease: 0.3, heartbeat: false, on_stale: :hold,
                                                  job_class: "PlainRerun", queue: "mine", payload: [6]) { sleep 1 }
    rescue IdempotentJob::LostClaimError => e
      e
    end
    sleep 0.6
    expect(IdempotentJob.perform_once("PlainRerun", 6, lease: 0.3, on_stale: :hold,
                                                       queue: "mine", payload: [6]) { :no }.decision).to eq(:held)
    holder.join
    sent = []
    IdempotentJob.on_rerun { |record| record.job_type == "PlainRerun" && (sent << record) }
    IdempotentJob.resolve("PlainRerun", 6, as: :rerun)
    expect(sent.map { |r| [r.operation_key, r.job_class, r.queue, r.args] }).to eq([["6", "PlainRerun", "mine", [6]]])
    outcome = IdempotentJob.perform_once("PlainRerun", sent.first.operation_key, lease: 0.3) { :ran }
    expect([outcome.value, outcome.claim.kind]).to eq(%i[ran retry])
  ensure
    IdempotentJob.instance_variable_set(:@rerun_senders, [])
  end

  it "a rerun of another language's record (a Celery task's name and queue) is not pushed to Sidekiq" do
    key = SecureRandom.hex(4)
    holder = Thread.new do
      IdempotentJob.perform_once("tasks.charge", key, lease: 0.3, heartbeat: false, on_stale: :hold,
                                                      job_class: "tasks.charge", queue: "celery") { sleep 1 }
    rescue IdempotentJob::LostClaimError => e
      e
    end
    sleep 0.6
    held = IdempotentJob.perform_once("tasks.charge", key, lease: 0.3, on_stale: :hold, job_class: "tasks.charge",
                                                           queue: "celery") { :no }
    expect(held.decision).to eq(:held)
    holder.join
    IdempotentJob.resolve("tasks.charge", key, as: :rerun)
    expect(Sidekiq::Queues.jobs_by_queue.values.flatten).to be_empty # control: "Tasks::Charge" would be pushed
    ruby_named = IdempotentJob.record("tasks.charge", key).dup.tap { |r| r.job_class = "Tasks::Charge" }
    expect(IdempotentJob::Sidekiq::Door.new.send(:sidekiq_job?, ruby_named)).to be(true)
  end

  describe "bad input" do
    it "refuses a key over 2000 bytes with the job type, a NUL, nil and empty values, with OperationKeyError" do
      expect { charge("k" * 1990) }.to raise_error(IdempotentJob::OperationKeyError, /PlainCharge: .*2001 bytes/)
      expect { charge("a\0b") }.to raise_error(IdempotentJob::OperationKeyError, /NUL/)
      expect { charge(nil) }.to raise_error(IdempotentJob::OperationKeyError, /the value is nil/)
      ["", [], {}].each do |empty|
        expect { charge(empty) }.to raise_error(IdempotentJob::OperationKeyError, /empty/)
      end
      expect(Effects.count).to eq(0)
    end

    it "refuses bad options with ConfigurationError naming the job" do
      expect { charge(heartbeat: "no") }.to raise_error(IdempotentJob::ConfigurationError,
                                                        /PlainCharge: heartbeat must be true or false, got "no"/)
      expect { charge(lease: 0.1) }.to raise_error(IdempotentJob::ConfigurationError, /at least 0.25 s/)
      expect { charge(lookup: :charged?) }.to raise_error(IdempotentJob::ConfigurationError, /must be callable/)
      expect { charge(scope: "x") }.to raise_error(IdempotentJob::ConfigurationError, /does not take :scope/)
      expect { charge(on_enqueue: :skip_completed) }
        .to raise_error(IdempotentJob::ConfigurationError, /PlainCharge: perform_once does not take on_enqueue: /)
      expect(Effects.count).to eq(0)
      expect { IdempotentJob.perform_once("PlainCharge", 42) }.to raise_error(ArgumentError, /needs a block/)
    end

    it "names the nearest keyword for a misspelled one, in the core's words (the Python package's too)" do
      message = /\APlainCharge: perform_once does not take :on_stael \(did you mean on_stale:\?\) \(it takes lease:/
      expect { charge(on_stael: :hold) }.to raise_error(IdempotentJob::ConfigurationError, message)
    end
  end

  describe "the replay scenarios through the plain door (the testing kit's PlainJob)" do
    let(:job) do
      IdempotentJob::Testing::PlainJob.new("PlainKitCharge") do |order_id, _cents|
        Effects.record("plain-kit", order_id)
      end
    end

    it "keeps the effect to once in every scenario" do
      matcher = be_idempotent_for(42, 1500).with_effect { Effects.count }.and_distinct_from(43, 1500)
      expect(job).to matcher
      expect(matcher.results.map(&:scenario)).to eq(%i[repeated concurrent_threads concurrent_processes
                                                       killed_after_claim killed_after_effect distinct])
    end

    it "fails every repeat scenario with the gem disabled" do
      IdempotentJob::Testing.without_gem do
        matcher = be_idempotent_for(42, 1500).with_effect { Effects.count }.and_distinct_from(43, 1500)
        expect(job).not_to matcher
        failed = matcher.results.reject(&:passed?).map(&:scenario)
        expect(failed).to eq(%i[repeated concurrent_threads concurrent_processes killed_after_claim
                                killed_after_effect])
      end
    end
  end
end
