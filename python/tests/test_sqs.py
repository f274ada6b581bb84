"""The SQS consumer loop (sqs_consumer.py, shown in python/README.md) against moto's
server mode (`moto_server`, an SQS *emulator* from PyPI, not AWS): duplicates run once;
an operation in progress elsewhere leaves its message invisible for retry_after and is
completed, not run again, when it comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import boto3
import pytest
from conftest import eventually
from effects import effects, record_effect
from sqs_consumer import consume_once

import idempotent_job

PORT = int(os.environ.get("MOTO_PORT", "25458"))


@pytest.fixture(scope="module")
def sqs():
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(PORT), "-H", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = boto3.client(
        "sqs",
        endpoint_url=f"http://127.0.0.1:{PORT}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )

    def up():
        try:
            client.list_queues()
            return True
        except Exception:
            return False

    try:
        eventually(up, "moto_server to answer", 30, 0.2)
        yield client
    finally:
        process.terminate()
        process.wait(10)


def _queue(sqs, scenario):
    return sqs.create_queue(QueueName=scenario, Attributes={"VisibilityTimeout": "30"})["QueueUrl"]


def _send(sqs, url, order_id, cents=500):
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"order_id": order_id, "cents": cents}))


def _drain(sqs, url, handle, until):
    decisions = []
    deadline = time.monotonic() + 60
    while not until():
        assert time.monotonic() < deadline, f"the queue did not drain: {decisions}"
        decisions += consume_once(sqs, url, handle)
    return decisions


def _empty(sqs, url):
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        attributes["ApproximateNumberOfMessages"] == "0"
        and attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    )


def test_duplicate_messages_run_once(sqs, scenario):
    url = _queue(sqs, scenario)
    for order in ("A", "A", "B", "A"):
        _send(sqs, url, f"{scenario}-{order}")

    def handle(body, reference):
        record_effect(scenario, body["order_id"])

    decisions = _drain(sqs, url, handle, lambda: _empty(sqs, url))
    assert effects(scenario, f"{scenario}-A") == 1 and effects(scenario, f"{scenario}-B") == 1
    assert sorted(decisions) == ["completed", "completed", "ran", "ran"]


def test_without_the_guard_duplicates_run_again(sqs, scenario):
    url = _queue(sqs, scenario)
    for _ in range(3):
        _send(sqs, url, f"{scenario}-A")
    while not _empty(sqs, url):
        for message in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            record_effect(scenario, json.loads(message["Body"])["order_id"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert effects(scenario) == 3


def test_an_operation_in_progress_elsewhere_comes_back_later(sqs, scenario):
    url = _queue(sqs, scenario)
    order = f"{scenario}-C"
    release = threading.Event()
    claimed = threading.Event()

    def elsewhere():
        def body(claim):
            claimed.set()
            release.wait(30)
            record_effect(scenario, order)

        idempotent_job.perform_once(
            "ChargeOrder", order, body, lease=60, payload={"order_id": order, "cents": 500}
        )

    holder = threading.Thread(target=elsewhere)
    holder.start()
    claimed.wait(30)
    _send(sqs, url, order)
    decisions = eventually(
        lambda: consume_once(sqs, url, lambda body, ref: record_effect(scenario, order)), "the message"
    )
    assert decisions == ["in_progress"]
    release.set()
    holder.join(30)
    decisions += _drain(sqs, url, lambda body, ref: record_effect(scenario, order), lambda: _empty(sqs, url))
    assert decisions[-1] == "completed"
    assert effects(scenario, order) == 1
