# frozen_string_literal: true

require "spec_helper"
require "digest"
require "socket"

# The two subscriber examples of docs/metrics.md (examples/metrics/*.rb, which the
# page shows verbatim), loaded as written and run against a fake collector: a UDP
# server on loopback for the StatsD counters, a stand-in tracer for the
# OpenTelemetry spans. Deliveries through the plain API against the real database.
RSpec.describe "The metrics subscriber examples (docs/metrics.md)" do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:job_type) { "SubscriberSpec#{rand(1 << 30)}" }
  let(:handles) { [] }

  before do
    allow(IdempotentJob).to receive(:subscribe).and_wrap_original do |original, *names, &block|
      original.call(*names, &block).tap { |handle| handles << handle }
    end
  end

  after { handles.each { |handle| IdempotentJob.unsubscribe(handle) } }

  def example_code(name)
    File.read(File.join(root, "examples/metrics/#{name}")).sub("# frozen_string_literal: true\n\n", "")
  end

  # Two deliveries of one operation: claimed + completed, then skipped.
  def deliver_twice
    2.times { IdempotentJob.perform_once(job_type, 42, lease: 30) { sleep 0.01 } }
  end

  it "docs/metrics.md shows each example file as it is" do
    page = File.read(File.join(root, "docs/metrics.md"))
    %w[statsd_subscriber.rb otel_subscriber.rb].each { |name| expect(page).to include(example_code(name)) }
  end

  it "the StatsD example sends a counter per event and a timer for durations to a UDP collector" do
    collector = UDPSocket.new
    collector.bind("127.0.0.1", 0)
    port = collector.addr[1]
    stub_const("ENV", ENV.to_h.merge("STATSD_PORT" => port.to_s))
    load File.join(root, "examples/metrics/statsd_subscriber.rb")
    deliver_twice

    lines = []
    until %w[claimed completed skipped].all? { |name| lines.include?("idempotent_job.#{name}.#{job_type}:1|c") } &&
          lines.count("idempotent_job.delivered.#{job_type}:1|c") == 2
      break unless collector.wait_readable(10)

      lines.concat(collector.recvfrom(65_535).first.split("\n"))
    end
    collector.close
    counters = lines.grep(/\|c\z/).grep(/\.#{job_type}:/)
    expect(counters).to eq(%W[idempotent_job.claimed.#{job_type}:1|c idempotent_job.completed.#{job_type}:1|c
                              idempotent_job.delivered.#{job_type}:1|c idempotent_job.skipped.#{job_type}:1|c
                              idempotent_job.delivered.#{job_type}:1|c])
    timers = lines.grep(/\|ms\z/)
    expect(timers.map { |l| l[/\A[^:]+/] }).to include("idempotent_job.claimed.#{job_type}.duration",
                                                       "idempotent_job.completed.#{job_type}.duration")
    completed = timers.find { |l| l.start_with?("idempotent_job.completed.#{job_type}.duration:") }
    expect(Float(completed[/:([\d.]+)\|ms/, 1])).to be >= 10.0 # the body slept 10 ms
  end

  it "the StatsD example never fails a delivery when nothing listens" do
    stub_const("ENV", ENV.to_h.merge("STATSD_PORT" => "9")) # discard port: nothing there
    load File.join(root, "examples/metrics/statsd_subscriber.rb")
    expect { deliver_twice }.not_to raise_error
  end

  # The stand-in: the few OpenTelemetry API calls the example makes (start_span with
  # attributes, start_timestamp and kind; status=; finish). The real SDK is not tested:
  # no OpenTelemetry gem can be installed where the suite runs (RubyGems is unreachable
  # and Debian packages none for Ruby); Python's spans run against the real SDK.
  def stand_in_tracer(spans)
    span_class = Struct.new(:name, :attributes, :start, :kind, :status, :finished) do
      def finish(end_timestamp:) = self.finished = end_timestamp
    end
    tracer = Object.new
    tracer.define_singleton_method(:start_span) do |name, attributes:, start_timestamp:, kind:|
      span_class.new(name, attributes, start_timestamp, kind).tap { |span| spans << span }
    end
    provider = Object.new
    provider.define_singleton_method(:tracer) { |name| name == "idempotent_job" ? tracer : raise(ArgumentError) }
    stub_const("OpenTelemetry", Module.new)
    stub_const("OpenTelemetry::Trace::Status", Module.new)
    OpenTelemetry.define_singleton_method(:tracer_provider) { provider }
    OpenTelemetry::Trace::Status.define_singleton_method(:ok) { [:ok] }
    OpenTelemetry::Trace::Status.define_singleton_method(:error) { |description| [:error, description] }
  end

  it "the OpenTelemetry example opens a span per delivery with its outcome, OK for repeats" do
    spans = []
    stand_in_tracer(spans)
    load File.join(root, "examples/metrics/otel_subscriber.rb")
    deliver_twice
    expect { IdempotentJob.perform_once(job_type, 43) { raise ArgumentError, "declined" } }
      .to raise_error(ArgumentError)

    ours = spans.select { |s| s.attributes["idempotency.job_type"] == job_type }
    expect(ours.map(&:name)).to eq(["idempotency #{job_type}"] * 3)
    expect(ours.map { |s| s.attributes["idempotency.outcome"] }).to eq(["ran", "skipped", nil])
    expect(ours.map(&:status)).to eq([[:ok], [:ok], [:error, "ArgumentError"]])
    expect(ours).to all(have_attributes(kind: :internal))
    expect(ours.map { |s| s.attributes["idempotency.door"] }).to eq(%w[plain plain plain])
    # The key only as the core's hash (the same as Python's), never the key itself.
    expect(ours[0].attributes["idempotency.key_hash"]).to eq(Digest::SHA256.hexdigest("#{job_type}\u000042")[0, 16])
    expect(ours.flat_map { |s| s.attributes.values }).not_to include("42")
    expect(ours[0].finished - ours[0].start).to be >= 0.01 # the body's 10 ms
  end

  it "labels every outcome from the core's list, a wait and a push dropped at enqueue included" do
    expect(IdempotentJob::Telemetry::OUTCOMES).to eq(%i[ran reclaimed replayed waited skipped in_progress held
                                                        given_up refused rejected_at_enqueue])
    seen = []
    handles << IdempotentJob::Events.subscribe(:delivered) { |_, payload| seen << payload }
    IdempotentJob.perform_once(job_type, 44, store_result: true) { 1 }
    IdempotentJob.perform_once(job_type, 44, store_result: true) { 2 }
    expect(seen.map { |p| p[:outcome] }).to eq(%i[ran replayed])
    expect(seen.last).to include(job_type:, operation_key: "44", door: :plain, error: nil)
    expect(seen.last[:duration]).to be_a(Float)
  end
end
