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


RUBY_REPORT = """
require "idempotent_job"
require "json"
IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"))
report = IdempotentJob::Repeats.report(since: Time.at(Float(ARGV[1])), job_type: ARGV[0],
                                       restarts: [Time.at(Float(ARGV[2]))])
puts JSON.generate({ lines: report.lines, csv: report.to_csv, summary: report.summary,
                     pairs: report.producer_pairs.map { |key, n| [*key, n] },
                     notes: report.operations.map(&:notes) })
"""


def concurrent_copy_and_re_enqueue(job: str) -> float:
    """Records one operation of ``job`` delivered three times: the first claim (``d1``,
    producer "orders"), a copy meeting its live claim (``d2``, "orders") and a copy after
    the completion (``d3``, "stripe"). Returns a ``since`` before them."""
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
    return since


def test_a_concurrent_copy_and_a_re_enqueue_are_classified_as_ruby_classifies_them(scenario):
    job = f"Repeats{scenario}"
    since = concurrent_copy_and_re_enqueue(job)

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


def test_the_report_prints_what_the_ruby_gems_report_prints(scenario):
    job = f"Report{scenario}"
    since = concurrent_copy_and_re_enqueue(job)
    restart = time.time() - 1  # passed through both bindings; matched to no repeat (none is a redelivery)

    def whole_report():
        report = idempotent_job.repeats_report(since=since, job_type=job, restarts=[restart])
        return report if [len(op["repeats"]) for op in report.operations] == [2] else None

    report = eventually(whole_report, "both repeats in the report")
    assert report.lines[0].startswith(f'{job} "order-1": completed, 2 repeats (concurrent copy after ')
    assert report.lines[1:] == [
        f"{job}: 1 operation repeated 2 times — 1 concurrent copy, 1 re-enqueue, other producer; "
        "1 enqueued by several producers",
        f"orders and stripe both enqueue {job} for the same operation: 1 operation",
    ]
    assert report.operations[0]["notes"] == ["enqueued by 2 producers: orders, stripe"]
    assert report.summary[job]["concurrent_copy"] == 1
    assert report.producer_pairs == {(job, "orders", "stripe"): 1}

    from_ruby = json.loads(ruby_script(RUBY_REPORT, job, str(since), str(restart)).strip().splitlines()[-1])
    assert from_ruby["lines"] == report.lines
    assert from_ruby["csv"] == report.csv
    assert from_ruby["summary"] == report.summary
    assert from_ruby["pairs"] == [[*key, n] for key, n in report.producer_pairs.items()]
    assert from_ruby["notes"] == [op["notes"] for op in report.operations]


def test_the_report_of_given_operations_refuses_an_unknown_cause():
    operation = {
        "job_type": "J",
        "operation_key": "k",
        "status": "completed",
        "repeats": [{"cause": "gremlins"}],
    }
    with pytest.raises(idempotent_job.ConfigurationError, match='J "k": a repeat\'s cause must be one of'):
        idempotent_job.RepeatsReport.of([operation])


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


def test_held_refuses_a_limit_below_one(scenario):
    # Before: -1 reached PostgreSQL ("LIMIT must not be negative": a DatabaseError).
    for limit in (-1, 0):
        refusal = rf"^held needs a limit of at least 1 \(up to \d+\), got {limit}$"
        with pytest.raises(idempotent_job.ConfigurationError, match=refusal):
            idempotent_job.held(limit=limit)


def test_the_report_reads_facts_nested_as_deep_as_a_claim_accepts(scenario):
    # Before: one record whose repeat facts were 126-127 levels deep broke the whole report
    # (the record wraps each repeat's facts two levels deeper: past serde_json's 128).
    since = time.time() - 5
    job_type = f"Deep{scenario}"
    deep: dict = {}
    for _ in range(idempotent_job._native.MAX_NESTING - 2):
        deep = {"d": deep}
    for delivery_id in ("d1", "d2"):  # facts {"deep": …}: MAX_NESTING levels
        idempotent_job.perform_once(job_type, "k", lambda claim: None, id=delivery_id, facts={"deep": deep})
    ops = idempotent_job.repeats(since=since, job_type=job_type)
    assert [len(op["repeats"]) for op in ops] == [1]
