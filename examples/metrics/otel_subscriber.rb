# frozen_string_literal: true

# OpenTelemetry spans from idempotent_job's events: one span per delivery (the
# `delivered` event) and per push dropped at enqueue (`enqueue_skipped`), named and
# labelled as the Python package's spans are (IdempotentJob::Telemetry: the core's
# vocabulary): `idempotency.outcome` (ran, reclaimed, replayed, waited, skipped,
# in_progress, held, given_up, refused, rejected_at_enqueue), the job type, a hash of the
# operation key (never the key itself) and the door. Status OK for every outcome: a
# repeat is not an error; only a delivery that raised is ERROR. The span lasts the
# delivery and its parent is the current span (the job's own span, when the queue's
# OpenTelemetry instrumentation opened one).
class IdempotentJobSpans
  # @param tracer [OpenTelemetry::Trace::Tracer] e.g.
  #   `OpenTelemetry.tracer_provider.tracer(IdempotentJob::Telemetry::TRACER_NAME)`
  def initialize(tracer)
    @tracer = tracer
  end

  # @param _name [Symbol] :delivered or :enqueue_skipped
  # @param payload [Hash] its payload (duration in seconds; error: a class name)
  # @return [void]
  def call(_name, payload)
    finish = Time.now
    span = @tracer.start_span(IdempotentJob::Telemetry.span_name(payload),
                              attributes: IdempotentJob::Telemetry.span_attributes(payload),
                              start_timestamp: finish - payload.fetch(:duration, 0), kind: :internal)
    span.status = if payload[:error]
                    OpenTelemetry::Trace::Status.error(payload[:error])
                  else
                    OpenTelemetry::Trace::Status.ok
                  end
    span.finish(end_timestamp: finish)
  end
end

# config/initializers/idempotent_job.rb (with the opentelemetry-sdk gem configured)
spans = IdempotentJobSpans.new(OpenTelemetry.tracer_provider.tracer(IdempotentJob::Telemetry::TRACER_NAME))
IdempotentJob.subscribe(:delivered, :enqueue_skipped) { |name, payload| spans.call(name, payload) }
