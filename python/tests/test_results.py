"""Stored results and replays from Python (issue 23): the core's protocol stores the
body's value with the completion; a repeat replays it, in this process and in a fresh
one (durable, not a cache); without store_result a repeat has no value; a value JSON
cannot hold is not stored and the completion stands."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading

import idempotent_job


def test_a_repeat_replays_the_stored_result(scenario):
    first = idempotent_job.perform_once(
        "PyReplay", scenario, lambda claim: {"charge_id": "ch_" + claim.operation_key}, store_result=True
    )
    assert first.ran and first.value == {"charge_id": "ch_" + scenario} and not first.replayed

    def not_run(claim):
        raise AssertionError("a repeat of a completed operation must not run")

    again = idempotent_job.perform_once("PyReplay", scenario, not_run, store_result=True)
    assert again.decision == "completed"
    assert again.replayed and again.label == "replayed"
    assert again.value == {"charge_id": "ch_" + scenario}
    assert (first.result_stored, again.result_stored, again.result_state) == (True, True, "stored")
    assert idempotent_job.record("PyReplay", scenario)["result_state"] == "stored"


def test_a_value_json_cannot_carry_is_not_stored_and_the_outcomes_say_so(scenario):
    # A datetime (which Celery itself serialises) or an object(): the completion stands,
    # the value is not stored, and both the run and a repeat say why.
    import datetime

    first = idempotent_job.perform_once(
        "PyUnencodable", scenario, lambda claim: datetime.datetime.now(), store_result=True
    )
    assert (first.decision, first.result_stored, first.result_state) == ("ran", False, "unencodable")
    again = idempotent_job.perform_once("PyUnencodable", scenario, lambda claim: "not run", store_result=True)
    assert (again.decision, again.value, again.replayed) == ("completed", None, False)
    assert (again.result_stored, again.result_state) == (False, "unencodable")
    assert idempotent_job.record("PyUnencodable", scenario)["result_state"] == "unencodable"


def test_a_fresh_process_reads_the_same_value(scenario):
    idempotent_job.perform_once("PyReplayFresh", scenario, lambda claim: [1, "two", None], store_result=True)
    code = (
        "import idempotent_job, json, sys\n"
        "o = idempotent_job.perform_once(\n"
        "    'PyReplayFresh', sys.argv[1], lambda c: 'ran again', store_result=True)\n"
        "print(json.dumps([o.decision, o.replayed, o.value]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, scenario], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == '["completed", true, [1, "two", null]]'


def test_without_store_result_a_repeat_has_no_value(scenario):
    idempotent_job.perform_once("PyNoStore", scenario, lambda claim: {"charge_id": "ch_1"})
    again = idempotent_job.perform_once("PyNoStore", scenario, lambda claim: "not run")
    assert again.decision == "completed" and not again.replayed and again.value is None
    assert (again.result_stored, again.result_state) == (False, None)


@contextlib.contextmanager
def _told(text):
    """Yields an Event set when the ``idempotent_job`` logger says ``text`` (the core's
    log line before a wait), so a test acts at that point rather than after a sleep."""
    seen = threading.Event()

    class Handler(logging.Handler):
        def emit(self, record):
            if text in record.getMessage():
                seen.set()

    logger, handler = logging.getLogger("idempotent_job"), Handler(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_waiter_gets_the_running_calls_value(scenario):
    started, finish, runs = threading.Event(), threading.Event(), []

    def holder_body(claim):
        started.set()
        finish.wait(30)
        runs.append("holder")
        return {"charge_id": "ch_w"}

    holder = threading.Thread(
        target=idempotent_job.perform_once,
        args=("PyWait", scenario, holder_body),
        kwargs={"store_result": True},
    )
    holder.start()
    assert started.wait(30)
    short = idempotent_job.perform_once(
        "PyWait", scenario, lambda claim: runs.append("short"), store_result=True, wait=0.2
    )
    waited = []
    waiter = threading.Thread(
        target=lambda: waited.append(
            idempotent_job.perform_once(
                "PyWait", scenario, lambda claim: runs.append("waiter"), store_result=True, wait=30
            )
        )
    )
    with _told("waiting up to") as waiting:
        waiter.start()
        # The holder finishes only once the waiter met its live claim and waits.
        assert waiting.wait(30)
        finish.set()
        holder.join(30)
        waiter.join(30)
    assert short.decision == "in_progress" and short.waited  # waited 0.2 s, still live
    assert waited[0].decision == "completed" and waited[0].replayed and waited[0].waited
    assert waited[0].value == {"charge_id": "ch_w"}
    assert runs == ["holder"]


def test_a_result_over_max_result_bytes_is_not_stored_and_the_completion_stands(scenario):
    import os

    idempotent_job.configure(database_url=os.environ["DATABASE_URL"], max_result_bytes=16)
    try:
        first = idempotent_job.perform_once(
            "PyTooLarge", scenario, lambda claim: "x" * 100, store_result=True
        )
        assert first.decision == "ran"
        assert (first.result_stored, first.result_state) == (False, "too_large")
        record = idempotent_job.record("PyTooLarge", scenario)
        assert record["status"] == "completed" and record["result_state"] == "too_large"
        again = idempotent_job.perform_once(
            "PyTooLarge", scenario, lambda claim: "must not run", store_result=True
        )
        assert again.decision == "completed" and again.value is None
        # The repeat says why it has no value (the outcome, not only a worker's log line).
        assert (again.replayed, again.result_stored, again.result_state) == (False, False, "too_large")
        assert (first.label, again.label) == ("ran", "skipped")
    finally:
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
