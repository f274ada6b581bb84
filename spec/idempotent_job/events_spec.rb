# frozen_string_literal: true

require "spec_helper"
require "open3"

RSpec.describe IdempotentJob::Events do
  let(:seen) { [] }
  let!(:handle) { IdempotentJob.subscribe { |name, payload| seen << [name, payload] } }

  after { IdempotentJob.unsubscribe(handle) }

  def names
    seen.map(&:first)
  end

  it "publishes every kind of decision, with job type, key, jid, attempt and timings" do
    notified = []
    as_handle = ActiveSupport::Notifications.subscribe(/\.idempotent_job\z/) { |name, *| notified << name }

    deliver(job_hash) # claimed, completed
    deliver(job_hash) # skipped
    first = claim("ChargeOrderJob", "7", "other", 30)
    deliver(job_hash([7, 1])) # deferred
    complete("ChargeOrderJob", "7", first[:token])

    SpecHooks.on(:after_effect) { raise "boom" }
    expect { deliver(job_hash([8, 1])) }.to raise_error(RuntimeError) # released
    SpecHooks.reset!

    claim("CapturePaymentJob", "p1", "dead", 0.1)
    sleep 0.2
    SpecHooks.on(:lookup) { :unknown }
    deliver(job_hash(["p1"], klass: CapturePaymentJob, "idempotency_on_stale" => "hold")) # taken_over, lookup, held
    claim("CapturePaymentJob", "p2", "dead", 0.1)
    sleep 0.2
    deliver(job_hash(["p2"], klass: CapturePaymentJob, "idempotency_on_stale" => "skip")) # given_up
    deliver(job_hash([42, 9])) # mismatch (and skipped)

    Effects.connection.exec("UPDATE idempotent_job_records SET completed_at = now() - interval '1 hour', " \
                            "first_claimed_at = now() - interval '1 hour' WHERE status = 'completed'")
    IdempotentJob.purge(older_than: 60) # purge_batch

    expected = %i[claimed completed skipped deferred released taken_over lookup held given_up mismatch purge_batch]
    expect(names.uniq).to include(*expected)
    claimed = seen.assoc(:claimed).last
    expect(claimed).to include(job_type: "ChargeOrderJob", operation_key: "42", attempt: 1, kind: :first)
    expect(claimed[:jid]).to be_a(String)
    expect(claimed[:duration]).to be_a(Float).and(be >= 0)
    expect(seen.assoc(:completed).last[:duration]).to be >= 0
    expect(seen.assoc(:lookup).last).to include(answer: :unknown, operation_key: "p1")
    expect(notified).to include("claimed.idempotent_job", "held.idempotent_job", "purge_batch.idempotent_job")
  ensure
    ActiveSupport::Notifications.unsubscribe(as_handle) if as_handle
  end

  it "reports a lost claim" do
    job = job_hash("idempotency_lease" => 0.3, "idempotency_heartbeat" => false)
    expect { stalled_holder_overtaken(job).join }.to raise_error(IdempotentJob::LostClaimError)
    expect(names).to include(:lost_claim)
  end

  it "never lets a subscriber's error change a delivery" do
    broken = IdempotentJob.subscribe(:claimed) { raise "subscriber bug" }
    deliver(job_hash)
    expect(Effects.count(42)).to eq(1)
  ensure
    IdempotentJob.unsubscribe(broken)
  end

  it "rejects unknown event names" do
    expect { IdempotentJob.subscribe(:clamed) { nil } }.to raise_error(ArgumentError, /unknown idempotent_job events/)
  end

  it "works without ActiveSupport" do
    script = <<~'RUBY'
      require "idempotent_job"
      abort "ActiveSupport is loaded" if defined?(ActiveSupport)
      IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"))
      seen = []
      IdempotentJob.subscribe(:purge_batch) { |name, payload| seen << [name, payload[:deleted]] }
      IdempotentJob::Events.publish(:purge_batch, deleted: 3, total: 3)
      puts seen.inspect
    RUBY
    root = File.expand_path("../..", __dir__)
    out, status = Open3.capture2e({ "RUBYLIB" => File.join(root, "lib") }, "ruby", "-e", script)
    expect(status).to be_success, out
    expect(out.strip).to eq("[[:purge_batch, 3]]")
  end
end
