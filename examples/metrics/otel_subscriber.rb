# frozen_string_literal: true

# OpenTelemetry spans from idempotent_job's events: one span per event, named
# `idempotent_job.<event>`, with the operation in its attributes. An event published
# with a duration (claimed: the claim's round trip; completed: the body's run) becomes
# a span of that length ending now; the others are instants. The span's parent is the
# current span (the job's own span, when the queue's OpenTelemetry instrumentation
# opened one).
class IdempotentJobSpans
  # Payload keys copied to span attributes (as `idempotent_job.<key>`).
  ATTRIBUTES = %i[job_type operation_key jid attempt kind decision answer deleted total door queue].freeze

  # @param tracer [OpenTelemetry::Trace::Tracer] e.g.
  #   `OpenTelemetry.tracer_provider.tracer("idempotent_job")`
  def initialize(tracer)
    @tracer = tracer
  end

  # @param name [Symbol] the event (IdempotentJob::Events::NAMES)
  # @param payload [Hash] its payload
  # @return [void]
  def call(name, payload)
    finish = Time.now
    start = payload[:duration] ? finish - payload[:duration] : finish
    attributes = payload.slice(*ATTRIBUTES).to_h { |key, value| ["idempotent_job.#{key}", value.to_s] }
    span = @tracer.start_span("idempotent_job.#{name}", attributes:, start_timestamp: start, kind: :internal)
    span.finish(end_timestamp: finish)
  end
end

# config/initializers/idempotent_job.rb (with the opentelemetry-sdk gem configured)
spans = IdempotentJobSpans.new(OpenTelemetry.tracer_provider.tracer("idempotent_job"))
IdempotentJob.subscribe { |name, payload| spans.call(name, payload) }
