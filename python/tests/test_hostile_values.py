"""The shared table of hostile values (conformance/hostile.json, issue 29) through the
plain Python door, each value as an operation key, a payload and a result: the process
survives (a crash fails the run), the body runs at most once, a refusal is the
library's error naming the job and the problem, and a result that cannot be stored
leaves the completion standing (a repeat does not run the body)."""

from __future__ import annotations

import pytest
from hostile import CASES, NAMES, digest, native, value

import idempotent_job
from idempotent_job import errors


def refused(case: dict, job_type: str, call) -> errors.IdempotentJobError:
    with pytest.raises(errors.IdempotentJobError) as raised:
        call()
    message = str(raised.value)
    assert message.startswith(job_type), message
    assert case["problem"].lower() in message.lower(), message
    return raised.value


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_as_an_operation_key(case, scenario):
    if not native(case):
        pytest.skip("not a Python value")
    job_type, runs = f"PyHostileKey-{scenario}", []
    hostile = value(case)

    def deliver():
        return idempotent_job.perform_once(job_type, hostile, lambda claim: runs.append(1))

    if case["key"] == "refused":
        for _ in range(2):
            assert isinstance(refused(case, job_type, deliver), errors.OperationKeyError)
        assert runs == []
    else:
        assert deliver().decision == "ran"
        assert deliver().decision == "completed"
        assert runs == [1]
        if "key_text" in case:
            record = idempotent_job.record(job_type, hostile)
            assert record["operation_key"] == case["key_text"] and record["status"] == "completed"


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_as_a_payload(case, scenario):
    if not native(case):
        pytest.skip("not a Python value")
    job_type, runs = f"PyHostilePayload-{scenario}", []
    hostile = value(case)

    def deliver():
        return idempotent_job.perform_once(job_type, "p", lambda claim: runs.append(1), payload=[hostile])

    if case["payload"] == "refused":
        for _ in range(2):
            assert isinstance(refused(case, job_type, deliver), errors.ConfigurationError)
        assert runs == []
        assert idempotent_job.record(job_type, "p") is None
    else:
        assert deliver().decision == "ran"
        assert deliver().decision == "completed"
        assert runs == [1]


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_as_a_result(case, scenario):
    if not native(case):
        pytest.skip("not a Python value")
    job_type, runs = f"PyHostileResult-{scenario}", []
    hostile = value(case)

    def body(claim):
        runs.append(1)
        return hostile

    def deliver():
        return idempotent_job.perform_once(job_type, "r", body, store_result=True)

    assert deliver().decision == "ran"
    repeat = deliver()
    assert repeat.decision == "completed" and runs == [1]
    assert repeat.replayed == (case["result"] == "stored")
    if case["result"] == "stored":
        if case.get("replays_as_integer"):
            assert [float(v) for v in repeat.value] == hostile
        else:
            assert digest(repeat.value) == digest(hostile)
