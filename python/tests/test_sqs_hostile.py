"""The shared table of hostile values (conformance/hostile.json, issue 29) through the SQS
door (idempotent_job.sqs.Consumer, against moto's server mode): each case's JSON text sent
by a producer in any language, twice as the operation key (`body.k`) and twice as the
payload (the message body). For each: the consumer survives, the body runs at most once,
and a message the library refuses is left on the queue (for redelivery or the queue's
redrive policy: SQS's dead-letter convention), never deleted. SQS itself refuses to send
a body over 256 KiB or holding characters XML cannot carry: those cases never leave the
producer."""

from __future__ import annotations

import pytest
from effects import effects, record_effect
from hostile import CASES, NAMES
from test_sqs import _queue

from idempotent_job.sqs import Consumer


def _raw_json(case: dict) -> str | None:
    """The case's value as JSON text any producer could send, or None when JSON has no
    text for it (a decimal, an object, bytes that are not UTF-8)."""
    if "json" in case:
        return case["json"]
    ((name, argument),) = case["make"].items()
    if name == "nest":
        return "[" * argument + "1" + "]" * argument
    if name == "string_bytes":
        return '"' + "x" * argument + '"'
    if name == "float":
        return argument
    if name == "integer_digits":
        return "9" * argument
    if name == "lone_surrogate":  # a lone surrogate escape, as any JSON writer may send it
        return f'"\\u{argument}"'
    if name == "lone_surrogate_key":
        return f'{{"\\u{argument}": 1}}'
    return None


def _left(sqs, url):
    left = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(left["ApproximateNumberOfMessages"]) + int(left["ApproximateNumberOfMessagesNotVisible"])


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_hostile_values_through_the_sqs_consumer(sqs, scenario, case, caplog):
    text = _raw_json(case)
    if text is None:
        pytest.skip("JSON has no text for this value: no producer can send it")
    url = _queue(sqs, scenario, visibility=1)
    bodies = {
        "key": f'{{"tag": "{scenario}-key", "k": {text}}}',
        "payload": f'{{"tag": "{scenario}-payload", "k": "p", "v": {text}}}',
    }
    sent = {}
    for use, body in bodies.items():
        try:
            for _ in range(2):
                sqs.send_message(QueueUrl=url, MessageBody=body)
            sent[use] = True
        except Exception as error:  # SQS refuses the body (its size or characters)
            assert len(body) > 256 * 1024 or "invalid" in str(error).lower(), error
    if not sent:
        pytest.skip("SQS refuses to send this value")
    consumer = Consumer(
        url,
        lambda message, claim: record_effect(message.body["tag"], claim.operation_key),
        job_type=f"SqsHostile-{scenario}",
        key="body.k",
        client=sqs,
        wait_seconds=1,
        max_messages=10,
    )
    actions = []
    for _ in range(4):  # every message received at least twice (a 1 s visibility timeout)
        actions += consumer.poll()
    for use in sent:
        refused = case[use] == "refused"
        assert effects(f"{scenario}-{use}") == (0 if refused else 1), f"{case['name']} as {use}"
    # The larger of two reads: moto reads its clock once per counter, so a message whose
    # visibility ends between them counts as neither in one read (test_sqs.py's _empty).
    remaining = max(_left(sqs, url), _left(sqs, url))
    refusals = sum(2 for use in sent if case[use] == "refused")
    assert remaining == refusals, f"{case['name']}: {remaining} messages left, {refusals} refused; {actions}"
    if refusals:
        problems = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
        assert problems and all(f"SqsHostile-{scenario}" in p for p in problems)
        assert any(case["problem"].lower() in p.lower() for p in problems), problems
