# frozen_string_literal: true

require_relative "active_job_jobs"
require_relative "active_job_workers"

# The five replay scenarios through ActiveJob on an adapter: 3 deliveries in a row, 2
# at once, death (SIGKILL) after the claim, death after the effect, 2 distinct
# operations; each with its control (the same job without the gem), which must show
# the duplicate. The including group defines `driver`: real worker processes
# (ActiveJobWorkers::Sidekiq, ::DelayedJob) or the spec process (::InProcess).
RSpec.shared_examples "ActiveJob replays through real workers" do |concurrent_workers:|
  around do |example|
    with_adapter(driver.adapter) { driver.around { example.run } }
  end

  # A failed example keeps its workers' log (the next example's driver starts a new one).
  after do |example|
    next unless example.exception && File.exist?(driver.log.to_s)

    kept = driver.log.sub(/\.log\z/, "-failed-#{example.metadata[:scoped_id].tr(":", "-")}.log")
    FileUtils.cp(driver.log, kept)
    warn "workers' log of the failed example: #{kept}"
  end

  def drain!
    expect(driver.wait_until_drained).to be(true), "jobs still pending; see #{driver.log}"
  end

  def aj_record(key, job_type: "AjChargeOrderJob")
    IdempotentJob.record(job_type, key)
  end

  # Runs deliveries against running workers, then waits for the queue to drain.
  def with_workers(count = 1, env = {})
    pids = Array.new(count) { driver.start(env) }
    value = yield
    drain!
    value
  ensure
    pids&.each { |pid| driver.stop(pid) }
  end

  def repeat(klass)
    identical = klass.new(42, 100)
    3.times { driver.deliver(identical) } # the same message (same job_id) three times
    3.times { klass.perform_later(43, 100) } # re-enqueued three times (new job_ids)
  end

  def at_once(klass)
    job = klass.new(44, 100, 0.6) # the body lingers after its effect: the copies overlap
    driver.deliver_at_once(job, 2)
  end

  def distinct
    AjChargeOrderJob.perform_later(45, 100)
    AjChargeOrderJob.perform_later(46, 100)
    orders = [SpecOrder.create!(number: "A-1"), SpecOrder.create!(number: "A-2")]
    2.times { AjShipOrderJob.perform_later(orders.first, "dhl") }
    AjShipOrderJob.perform_later(orders.last, "dhl")
    orders
  end

  before(:context) { SpecOrder.setup! }

  it "3 deliveries in a row, identical or re-enqueued: the effect once, the repeats counted" do
    with_workers { repeat(AjChargeOrderJob) }
    expect([Effects.count(42), Effects.count(43)]).to eq([1, 1])
    # Copies that meet the running one are re-enqueued and counted again when they return.
    expect(aj_record(42)).to have_attributes(status: :completed, attempts: 1, duplicates: a_value >= 2)
    expect(aj_record(43)).to have_attributes(status: :completed, attempts: 1, duplicates: a_value >= 2)
  end

  it "control, 3 deliveries without the gem: the effect three times" do
    with_workers { repeat(AjChargeOrderUnprotectedJob) }
    expect([Effects.count(42), Effects.count(43)]).to eq([3, 3])
  end

  it "2 deliveries at once (#{concurrent_workers}): one runs, the other is re-enqueued and then skipped" do
    with_workers(concurrent_workers == :processes ? 2 : 1) { at_once(AjChargeOrderJob) }
    expect(Effects.count(44)).to eq(1)
    expect(aj_record(44)).to have_attributes(status: :completed, attempts: 1, duplicates: a_value >= 1)
  end

  it "control, 2 at once without the gem: both run" do
    with_workers(concurrent_workers == :processes ? 2 : 1) { at_once(AjChargeOrderUnprotectedJob) }
    expect(Effects.count(44)).to eq(2)
  end

  it "2 distinct operations (one keyed by a GlobalID): each runs once" do
    orders = with_workers { distinct }
    expect([Effects.count(45), Effects.count(46)]).to eq([1, 1])
    expect([Effects.count("A-1/dhl"), Effects.count("A-2/dhl")]).to eq([1, 1])
    gid = orders.first.to_global_id.to_s
    record = IdempotentJob.record("aj-shipping", JSON.generate([gid, "dhl"]))
    expect(record).to have_attributes(status: :completed, duplicates: a_value >= 1)
  end

  # A worker SIGKILLed at `point` while it holds operation 47, then two more copies of
  # the message (the queue's redelivery of the lost one, and a repeat) for the next
  # worker: the copies inside the lease are re-enqueued (inline: wait), never lost.
  def killed_at(point, klass)
    job = klass.new(47, 100)
    env = driver.crash_at(point, job)
    yield if block_given?
    with_workers(1, env || {}) { 2.times { driver.deliver(job) } }
  end

  it "death after the claim (SIGKILL): no copy runs inside the lease; after it, one runs the effect once" do
    killed_at(:before_effect, AjChargeOrderJob) do
      expect(aj_record(47)).to have_attributes(status: :claimed, attempts: 1)
    end
    expect(Effects.count(47)).to eq(1)
    expect(aj_record(47)).to have_attributes(status: :completed, takeovers: 1)
  end

  it "control, death after the claim without the gem: the redeliveries both run" do
    killed_at(:before_effect, AjChargeOrderUnprotectedJob)
    expect(Effects.count(47)).to be >= 2
  end

  it "death after the effect (SIGKILL) under on_stale: :hold: the effect stays once, the operation is held" do
    killed_at(:after_effect, AjRefundOrderJob) { expect(Effects.count(47)).to eq(1) }
    expect(Effects.count(47)).to eq(1)
    expect(aj_record(47, job_type: "AjRefundOrderJob")).to have_attributes(status: :held)
  end

  it "control, death after the effect without the gem: the effect repeats" do
    killed_at(:after_effect, AjChargeOrderUnprotectedJob)
    expect(Effects.count(47)).to be >= 2
  end
end

# A worker process stopped while a job is still in its body, after its effect, so that
# the backend raises inside perform and hands the job on (Delayed Job reschedules it,
# Sidekiq requeues it): for the gem a crash. The including group runs on real worker
# processes (`driver`) and defines `start_stopping_worker` (→ the pid of a worker that
# will raise inside perform when stopped) and `enqueue_lingering(klass)` (operation 49,
# lingering in its body after the effect until the stop).
RSpec.shared_examples "a worker stopped inside the body" do |adapter:, copy:|
  around { |example| with_adapter(adapter) { driver.around { example.run } } }

  def stopped_mid_job(klass)
    pid = start_stopping_worker
    enqueue_lingering(klass)
    Timeout.timeout(20) { sleep 0.05 until Effects.count(49) == 1 }
    driver.stop(pid)
    yield if block_given?
    successor = driver.start
    expect(driver.wait_until_drained).to be(true), "see #{driver.log}"
    driver.stop(successor)
  end

  it "is a crash: the claim is kept for its lease, and the #{copy} does not repeat the effect" do
    stopped_mid_job(AjRefundOrderJob) do
      expect(IdempotentJob.record("AjRefundOrderJob", 49)).to have_attributes(status: :claimed, last_error: nil)
    end
    expect(Effects.count(49)).to eq(1)
    expect(IdempotentJob.record("AjRefundOrderJob", 49)).to have_attributes(status: :held, takeovers: 1)
  end

  it "control: without the gem the #{copy} repeats the effect" do
    stopped_mid_job(AjChargeOrderUnprotectedJob)
    expect(Effects.count(49)).to eq(2)
  end
end
