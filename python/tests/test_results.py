"""Stored results and replays from Python (issue 23): the core's protocol stores the
body's value with the completion; a repeat replays it, in this process and in a fresh
one (durable, not a cache); without store_result a repeat has no value; a value JSON
cannot hold is not stored and the completion stands."""

from __future__ import annotations

import subprocess
import sys

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
    assert again.replayed
    assert again.value == {"charge_id": "ch_" + scenario}
    assert idempotent_job.record("PyReplay", scenario)["result_state"] == "stored"


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
