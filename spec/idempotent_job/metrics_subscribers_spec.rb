# frozen_string_literal: true

require "spec_helper"
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
    until %w[claimed completed skipped].all? { |name| lines.include?("idempotent_job.#{name}.#{job_type}:1|c") }
      break unless collector.wait_readable(10)

      lines.concat(collector.recvfrom(65_535).first.split("\n"))
    end
    collector.close
    counters = lines.grep(/\|c\z/).grep(/\.#{job_type}:/)
    expect(counters).to eq(%W[idempotent_job.claimed.#{job_type}:1|c idempotent_job.completed.#{job_type}:1|c
                              idempotent_job.skipped.#{job_type}:1|c])
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

  it "the OpenTelemetry example opens a span per event, lasting the event's duration" do
    spans = []
    span_class = Struct.new(:name, :attributes, :start, :kind, :finished) do
      def finish(end_timestamp:) = self.finished = end_timestamp
    end
    tracer = Object.new
    tracer.define_singleton_method(:start_span) do |name, attributes:, start_timestamp:, kind:|
      span_class.new(name, attributes, start_timestamp, kind).tap { |span| spans << span }
    end
    provider = Object.new
    provider.define_singleton_method(:tracer) { |name| name == "idempotent_job" ? tracer : raise(ArgumentError) }
    stub_const("OpenTelemetry", Module.new)
    OpenTelemetry.define_singleton_method(:tracer_provider) { provider }
    load File.join(root, "examples/metrics/otel_subscriber.rb")
    deliver_twice

    ours = spans.select { |s| s.attributes["idempotent_job.job_type"] == job_type }
    expect(ours.map(&:name)).to eq(%w[idempotent_job.claimed idempotent_job.completed idempotent_job.skipped])
    expect(ours).to all(have_attributes(kind: :internal))
    expect(ours.map { |s| s.attributes["idempotent_job.operation_key"] }).to eq(%w[42 42 42])
    completed = ours[1]
    expect(completed.finished - completed.start).to be >= 0.01 # the body's 10 ms
    expect(ours[2].finished).to eq(ours[2].start) # skipped: an instant
  end
end
