"""The repeats report from Python (``idempotent_job.repeats``): a concurrent copy (a second
delivery meeting a live claim, from a real thread) and a re-enqueue after the completion,
recorded in the real PostgreSQL, classified by the core as the Ruby gem's
``IdempotentJob.repeats`` classifies the same record (run by ``ruby -Ilib``)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import eventually
from test_cross_language import ruby_script

import idempotent_job

RUBY_REPEATS = """
require "idempotent_job"
require "json"
IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"))
ops = IdempotentJob.repeats(since: Time.at(Float(ARGV[1])), job_type: ARGV[0])
puts JSON.generate(ops.map { |op|
  { operation_key: op.operation_key, producers: op.producers,
    repeats: op.repeats.map { |r|
      { cause: r.cause, id: r.id, live_claim: r.live_claim, deferred_return: r.deferred_return,
        producer: r.producer, first_producer: r.first_producer, decision: r.decision,
        after_claim: r.after_claim } } }
})
"""


def test_a_concurrent_copy_and_a_re_enqueue_are_classified_as_ruby_classifies_them(scenario):
    job = f"Repeats{scenario}"
    since = time.time() - 5
    started, release = threading.Event(), threading.Event()

    def body(claim):
        started.set()
        assert release.wait(60)
        return "charged"

    def deliver(delivery_id: str, producer: str):
        return idempotent_job.perform_once(
            job, "order-1", body, id=delivery_id, facts={"jid": delivery_id, "producer": producer}
        )

    first = threading.Thread(target=deliver, args=("d1", "orders"))
    first.start()
    try:
        assert started.wait(60)
        assert deliver("d2", "orders").decision == "in_progress"  # met the live claim
    finally:
        release.set()
        first.join(60)
    assert deliver("d3", "stripe").decision == "completed"  # sent again after the completion

    ops = eventually(
        lambda: [op for op in idempotent_job.repeats(since=since, job_type=job) if len(op["repeats"]) == 2],
        "both repeats in the report",
    )
    assert len(ops) == 1
    op = ops[0]
    assert op["operation_key"] == "order-1"
    assert op["status"] == "completed"
    assert op["producers"] == ["orders", "stripe"]
    assert op["duplicates"] == 2
    assert [(r["cause"], r["id"], r["live_claim"], r["deferred_return"]) for r in op["repeats"]] == [
        ("concurrent_copy", "d2", True, False),
        ("re_enqueue_other_producer", "d3", False, False),
    ]
    assert all(r["first_producer"] == "orders" for r in op["repeats"])

    from_ruby = json.loads(ruby_script(RUBY_REPEATS, job, str(since)).strip().splitlines()[-1])
    assert [o["operation_key"] for o in from_ruby] == ["order-1"]
    assert from_ruby[0]["producers"] == op["producers"]
    for mine, theirs in zip(op["repeats"], from_ruby[0]["repeats"], strict=True):
        for name in ("cause", "id", "live_claim", "deferred_return", "producer", "first_producer"):
            assert theirs[name] == mine[name], name
        assert theirs["decision"] == mine["decision"]
        assert theirs["after_claim"] == pytest.approx(mine["after_claim"], abs=1e-3)


def test_repeats_refuses_what_is_not_a_time(scenario):
    import datetime

    with pytest.raises(idempotent_job.ConfigurationError, match="since"):
        idempotent_job.repeats(since="yesterday")
    with pytest.raises(idempotent_job.ConfigurationError, match="timezone-aware"):
        idempotent_job.repeats(since=datetime.datetime(2026, 1, 1))  # noqa: DTZ001 - the naive time refused
    with pytest.raises(idempotent_job.ConfigurationError, match="restart_window"):
        idempotent_job.repeats(restart_window=-1)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert idempotent_job.repeats(since=now, job_type=f"None{scenario}") == []
