"""OpenTelemetry spans for deliveries, when ``opentelemetry-api`` is installed
(``pip install "idempotent_job[otel]"``); without it, nothing is traced and nothing is
imported. One span per delivery, named and labelled by the core's tracing vocabulary
(``_native.span_name`` / ``span_attributes``: ``idempotency.outcome`` and the rest), with
status OK for every outcome (a repeat is not an error); only an exception leaving the
delivery (the body's own, or the core's) sets status ERROR. The body runs inside the span,
so its own spans are children of it."""

from __future__ import annotations

from typing import Any, Callable

from . import _native

try:
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # the optional extra is not installed: no tracing
    trace = None

_tracer: Any = None


def perform(door: str, job_type: str, operation_key: str, call: Callable[[], Any]) -> Any:
    """Runs ``call()`` (one delivery: the native ``perform_once``) inside a span of the
    ``idempotent_job`` tracer when OpenTelemetry is installed; returns its Outcome.
    ``door``: "plain", "celery" or "sqs"."""
    global _tracer
    if trace is None:
        return call()
    if _tracer is None:
        # A proxy until the app sets its tracer provider: spans go to it from then on.
        _tracer = trace.get_tracer(_native.TRACER_NAME, _native.__version__)
    with _tracer.start_as_current_span(
        _native.span_name(job_type), record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            outcome = call()
        except BaseException as error:
            if span.is_recording():
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            raise
        if span.is_recording():
            span.set_attributes(_native.span_attributes(door, job_type, operation_key, outcome))
            span.set_status(Status(StatusCode.OK))
        return outcome
