# frozen_string_literal: true

module IdempotentJob
  # The tracing vocabulary for Ruby subscribers, the core's (the same span name,
  # attribute names and outcome labels as the Python package's OpenTelemetry spans), so a
  # subscriber of the `delivered` and `enqueue_skipped` events can open one span per
  # delivery in which a repeat is not an error. The gem itself depends on no tracing
  # library: see `examples/metrics/otel_subscriber.rb` and docs/metrics.md.
  module Telemetry
    # The tracer's (instrumentation scope's) name: "idempotent_job".
    TRACER_NAME = Native::TRACER_NAME
    # Every outcome label (Symbols): :ran, :reclaimed, :replayed, :waited, :skipped,
    # :in_progress, :held, :given_up, :refused, :rejected_at_enqueue. None is an error.
    OUTCOMES = Native::OUTCOMES

    module_function

    # @param payload [Hash] a `delivered` or `enqueue_skipped` event's payload
    # @return [String] the span's name, "idempotency <job type>"
    # @raise [KeyError] when the payload has no :job_type
    def span_name(payload)
      Native.span_name(payload.fetch(:job_type).to_s)
    end

    # The span's attributes: `idempotency.outcome` (absent when the delivery raised),
    # `idempotency.job_type`, `idempotency.key_hash` (the core's hash of the job type and
    # operation key, 16 hex characters, the same as Python's: never the raw key) and
    # `idempotency.door`.
    # @param payload [Hash] a `delivered` or `enqueue_skipped` event's payload
    # @return [Hash{String => String}]
    def span_attributes(payload)
      names = Native::SPAN_ATTRIBUTES
      attributes = { names.fetch(:job_type) => payload[:job_type].to_s,
                     names.fetch(:key_hash) => Native.key_hash(payload[:job_type].to_s, payload[:operation_key].to_s),
                     names.fetch(:door) => payload[:door].to_s }
      attributes[names.fetch(:outcome)] = payload[:outcome].to_s if payload[:outcome]
      attributes
    end
  end
end
