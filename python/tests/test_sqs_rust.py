"""The Rust door's SQS consumer (examples/rust-sqs, aws-sdk-sqs) against moto's server mode
(`moto_server`, an SQS *emulator*, not AWS): two consumer processes on one queue. The
example is a crate of its own (aws-sdk-sqs's build is long): bin/test builds it in a step of
its own and runs this module with IDEMPOTENT_JOB_SQS_EXAMPLE set to the binary; without it
the module is skipped (bin/test-python's run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psycopg
import pytest
from conftest import MOTO_PORT, eventually

import idempotent_job

BINARY = os.environ.get("IDEMPOTENT_JOB_SQS_EXAMPLE")
pytestmark = pytest.mark.skipif(
    not BINARY, reason="IDEMPOTENT_JOB_SQS_EXAMPLE (the built examples/rust-sqs binary) is not set"
)


def _charges(order_id):
    with psycopg.connect(os.environ["DATABASE_URL"]) as c:
        # the example's consumers create the table too: one advisory lock for all creators
        c.execute("SELECT pg_advisory_xact_lock(hashtext('example_charges'))")
        c.execute(
            "CREATE TABLE IF NOT EXISTS example_charges (order_id text, cents int, pid int, "
            "at timestamptz DEFAULT now())"
        )
        c.commit()
        return c.execute("SELECT count(*) FROM example_charges WHERE order_id = %s", (order_id,)).fetchone()[
            0
        ]


def _consumers(url, count=2, **env):
    environment = dict(
        os.environ,
        QUEUE_URL=url,
        SQS_ENDPOINT=f"http://127.0.0.1:{MOTO_PORT}",
        **{k.upper(): str(v) for k, v in env.items()},
    )
    return [
        subprocess.Popen([BINARY], env=environment, stdout=subprocess.PIPE, text=True) for _ in range(count)
    ]


def _stop(processes, sig=signal.SIGTERM):
    lines = []
    for p in processes:
        if p.poll() is None:
            p.send_signal(sig)
    for p in processes:
        out, _ = p.communicate(timeout=60)
        lines += [line.split() for line in out.splitlines()]
    return lines


def _empty(sqs, url):
    """Empty in two reads in a row (moto reads its clock once per counter: a message whose
    visibility ends between them counts as neither; test_sqs.py's _empty says more)."""

    def counts():
        a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return a["ApproximateNumberOfMessages"], a["ApproximateNumberOfMessagesNotVisible"]

    return counts() == ("0", "0") and counts() == ("0", "0")


def _send(sqs, url, order):
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"order_id": order, "cents": 500}))


def test_the_same_message_three_times_charges_once(sqs, scenario):
    url = sqs.create_queue(QueueName=scenario)["QueueUrl"]
    order = f"{scenario}-A"
    for _ in range(3):
        _send(sqs, url, order)
    consumers = _consumers(url)
    try:
        eventually(lambda: _empty(sqs, url) and _charges(order) >= 1, "the queue to drain", 90, 0.2)
    finally:
        lines = _stop(consumers)
    assert _charges(order) == 1
    assert sorted(line[2] for line in lines).count("delete") == 3, lines


def test_a_charge_three_times_longer_than_the_visibility_timeout_is_received_once(sqs, scenario):
    url = sqs.create_queue(QueueName=scenario, Attributes={"VisibilityTimeout": "2"})["QueueUrl"]
    order = f"{scenario}-A"
    _send(sqs, url, order)
    consumers = _consumers(url, lease=3, charge_seconds=6)
    try:
        eventually(lambda: _empty(sqs, url) and _charges(order) >= 1, "the charge", 90, 0.2)
    finally:
        lines = _stop(consumers)
    assert [line[2] for line in lines] == ["delete"], lines  # one receive, by one consumer
    assert _charges(order) == 1


def test_a_consumer_killed_mid_charge_comes_back_and_is_held(sqs, scenario):
    url = sqs.create_queue(QueueName=scenario, Attributes={"VisibilityTimeout": "3"})["QueueUrl"]
    order = f"{scenario}-A"
    _send(sqs, url, order)
    (first,) = _consumers(url, 1, lease=3, on_stale="hold", charge_seconds=120)
    eventually(lambda: idempotent_job.record("ChargeOrder", order), "the first claim", 60, 0.1)
    _stop([first], signal.SIGKILL)
    second = _consumers(url, 1, lease=3, on_stale="hold")
    try:
        eventually(lambda: _empty(sqs, url), "the message to come back and be held", 90, 0.2)
    finally:
        _stop(second)
    assert idempotent_job.record("ChargeOrder", order)["status"] == "held"
    assert _charges(order) == 0
