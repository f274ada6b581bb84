"""Each Python door's words in the core's log lines (its ``WORDS``, passed to the core
with its job type's protocol): a delivery that meets a live claim is told with that
door's word for a delivery's id and for a deferral."""

from __future__ import annotations

import threading

import pytest

from idempotent_job import _door, celery, sqs


@pytest.mark.parametrize("door", [celery, sqs], ids=["celery", "sqs"])
def test_a_deferral_is_told_in_the_doors_words(scenario, door, caplog):
    words = door.WORDS
    protocol = _door.JobProtocol(scenario, {}, words).get()
    claimed, finish = threading.Event(), threading.Event()

    def deliver(delivery_id, body):
        return _door.deliver("test", protocol, scenario, "k", body, [], delivery_id, 0, None, None, {}, None)

    def hold(claim):
        claimed.set()
        finish.wait(30)

    first = threading.Thread(target=deliver, args=("first", hold))
    first.start()
    try:
        assert claimed.wait(30)
        with caplog.at_level("INFO", logger="idempotent_job"):
            outcome, error = deliver("second", lambda claim: None)
    finally:
        finish.set()
        first.join()
    assert error is None and outcome.decision == "in_progress"
    label, defer = words["id_label"], words["defer_text"]
    assert f"({label} second) is in progress under {label} first; {defer} " in caplog.text
