"""OpenTelemetry spans (issue 34) against the SDK's in-memory exporter: one span per
delivery through the plain API, the Celery door (eager) and the SQS door (moto), with
``idempotency.outcome`` for each decision, the key only as a hash, and status OK for every
outcome that is not an error (a repeat is not a failure); a raising body is ERROR."""

from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

import idempotent_job  # noqa: E402

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    # The global provider can be set once per process; a module-wide exporter is cleared per test.
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(tracer_provider)
    if trace.get_tracer_provider() is not tracer_provider:
        pytest.skip("another test set the global tracer provider first")
    yield tracer_provider
    tracer_provider.shutdown()  # later modules' deliveries are not exported (nor kept in memory)


@pytest.fixture(autouse=True)
def spans():
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def _ours(exporter):
    return [s for s in exporter.get_finished_spans() if s.name.startswith("idempotency ")]


def _hash(job_type, key):
    return hashlib.sha256(f"{job_type}\0{key}".encode()).hexdigest()[:16]


def test_plain_deliveries_carry_their_outcome_and_a_hashed_key(scenario, spans):
    job = "PyTraced"
    first = idempotent_job.perform_once(job, scenario, lambda c: {"ok": 1}, store_result=True)
    again = idempotent_job.perform_once(job, scenario, lambda c: 2, store_result=True)
    other = scenario + "-b"
    idempotent_job.perform_once(job, other, lambda c: 1)
    skipped = idempotent_job.perform_once(job, other, lambda c: 2)
    assert (first.decision, again.replayed, skipped.decision) == ("ran", True, "completed")
    got = _ours(spans)
    assert [s.attributes["idempotency.outcome"] for s in got] == ["ran", "replayed", "ran", "skipped"]
    for span in got:
        assert span.name == f"idempotency {job}"
        assert span.status.status_code == StatusCode.OK
        assert span.attributes["idempotency.job_type"] == job
        assert span.attributes["idempotency.door"] == "plain"
        assert scenario not in json.dumps(dict(span.attributes))  # never the raw key
    assert got[0].attributes["idempotency.key_hash"] == _hash(job, scenario)
    assert got[0].attributes["idempotency.attempt"] == 1
    assert got[1].attributes["idempotency.duplicates"] == 1
    assert got[1].attributes["idempotency.result_stored"] is True


def test_a_live_claim_is_in_progress_and_ok_and_the_body_is_a_child(scenario, spans):
    job = "PyTracedLive"
    inner = []

    def body(claim):
        inner.append(idempotent_job.perform_once(job, scenario, lambda c: "never"))
        with trace.get_tracer("app").start_as_current_span("charge"):
            pass

    idempotent_job.perform_once(job, scenario, body)
    assert inner[0].decision == "in_progress"
    got = {s.name: s for s in spans.get_finished_spans()}
    outer = [s for s in _ours(spans) if s.attributes["idempotency.outcome"] == "ran"][0]
    live = [s for s in _ours(spans) if s.attributes["idempotency.outcome"] == "in_progress"][0]
    assert live.status.status_code == StatusCode.OK
    assert live.parent.span_id == outer.context.span_id
    assert got["charge"].parent.span_id == outer.context.span_id


def test_a_repeat_that_waited_for_the_running_call_is_waited(scenario, spans):
    import threading

    from test_results import _told

    job = "PyTracedWait"
    started, finish = threading.Event(), threading.Event()

    def holder_body(claim):
        started.set()
        finish.wait(30)
        return "done"

    holder = threading.Thread(target=idempotent_job.perform_once, args=(job, scenario, holder_body))
    holder.start()
    assert started.wait(30)
    waited = []
    waiter = threading.Thread(
        target=lambda: waited.append(idempotent_job.perform_once(job, scenario, lambda c: "never", wait=30))
    )
    with _told("waiting up to") as waiting:
        waiter.start()
        assert waiting.wait(30)  # the holder finishes only once the waiter waits
        finish.set()
        holder.join(30)
        waiter.join(30)
    assert waited[0].decision == "completed" and waited[0].waited
    labels = sorted(s.attributes["idempotency.outcome"] for s in _ours(spans))
    assert labels == ["ran", "waited"]
    assert all(s.status.status_code == StatusCode.OK for s in _ours(spans))


def test_held_and_reclaimed_are_ok_and_a_raising_body_is_an_error(scenario, spans):
    job = "PyTracedStale"
    # A stale claim: a body that exits the process is simulated by a claim whose lease
    # is let run out (SystemExit keeps the claim: a crash, not a release).
    for policy, label in (("hold", "held"), ("reclaim", "reclaimed")):
        key = f"{scenario}-{policy}"
        with pytest.raises(SystemExit):
            idempotent_job.perform_once(job, key, _exit, lease=1, on_stale=policy)
        outcome = _until_settled(job, key, policy)
        assert _ours(spans)[-1].attributes["idempotency.outcome"] == label, outcome
        assert _ours(spans)[-1].status.status_code == StatusCode.OK
    crash = [s for s in _ours(spans) if s.status.status_code == StatusCode.ERROR]
    assert crash and all(s.events[0].name == "exception" for s in crash)  # the SystemExits

    with pytest.raises(ValueError):
        idempotent_job.perform_once(job, scenario, _raise)
    failed = _ours(spans)[-1]
    assert failed.status.status_code == StatusCode.ERROR and "ValueError" in failed.status.description


def _exit(claim):
    raise SystemExit(1)


def _raise(claim):
    raise ValueError("the body failed")


def _until_settled(job, key, policy):
    import time

    deferrals = 0
    while True:
        outcome = idempotent_job.perform_once(
            job, key, lambda c: "ran", lease=1, on_stale=policy, deferrals=deferrals
        )
        if outcome.decision != "in_progress":
            return outcome
        deferrals += 1
        time.sleep(outcome.retry_after)


def test_the_celery_door_traces_a_delivery(scenario, spans):
    # Eager (apply): the door's path to the core, with its door name.
    import celery_tasks

    celery_tasks.charge.apply((scenario, scenario))
    celery_tasks.charge.apply((scenario, scenario))
    got = _ours(spans)
    assert [s.attributes["idempotency.outcome"] for s in got] == ["ran", "replayed"]
    assert {s.attributes["idempotency.door"] for s in got} == {"celery"}
    assert got[0].name == f"idempotency {celery_tasks.charge.name}"


def test_the_sqs_door_traces_a_delivery(sqs, scenario, spans):
    from idempotent_job.sqs import Consumer

    url = sqs.create_queue(QueueName=scenario)["QueueUrl"]
    for _ in range(2):
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"order_id": scenario}))
    consumer = Consumer(
        url, lambda m, c: "done", job_type="SqsTraced", key="body.order_id", client=sqs, wait_seconds=0
    )
    seen = []
    while len(seen) < 2:
        seen += consumer.poll()
    got = _ours(spans)
    assert sorted(s.attributes["idempotency.outcome"] for s in got) == ["ran", "skipped"]
    assert {s.attributes["idempotency.door"] for s in got} == {"sqs"}
