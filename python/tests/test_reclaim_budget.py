"""The reclaim budget (``max_takeovers``) through the plain API in forked processes: a
body that SIGKILLs its own process every time (a poison operation: out of memory, a
segfault in a C library) is reclaimed at every lease end under ``reclaim``; with
``max_takeovers=2`` it runs three times (the first claim and two takeovers) and the next
stale claim holds the operation for a person, saying why, instead of looping."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest
from effects import effects, pids, record_effect, record_start

import idempotent_job
from idempotent_job import errors

LEASE = 0.5
REASON = "the reclaim budget is spent: 3 stale takeovers of this operation, max_takeovers 2"


def _deliver(scenario: str, options: dict) -> tuple[int, str | None, float]:
    """One delivery in a forked child, as a worker process would take it: its body
    records its start and SIGKILLs its own process. Returns the child's exit code and,
    when it was not killed, the outcome's decision and retry_after."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(read)

            def poison(claim):
                record_start(scenario, "1")
                os.kill(os.getpid(), signal.SIGKILL)

            outcome = idempotent_job.perform_once("PoisonJob", scenario, poison, lease=LEASE, **options)
            os.write(write, f"{outcome.decision} {outcome.retry_after or 0}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with os.fdopen(read) as report:
        said = report.read().split()
    return code, (said[0] if said else None), (float(said[1]) if said else 0.0)


def _redeliver(scenario: str, options: dict, deliveries: int) -> list[str]:
    """Delivers again and again, as a queue redelivers a message whose worker died,
    until a delivery is neither killed nor deferred or `deliveries` were made; returns
    what each delivery did ("killed" or its decision)."""
    seen = []
    for _ in range(deliveries):
        code, decision, retry_after = _deliver(scenario, options)
        seen.append("killed" if code == -signal.SIGKILL else decision)
        if decision == "in_progress":
            time.sleep(retry_after)
        elif decision is not None:
            break
    return seen


def _starts(scenario: str) -> int:
    """How many times the body started (each start was a run that was killed)."""
    return len(pids(scenario)["starts"])


def test_a_poison_operation_is_held_after_max_takeovers(scenario):
    seen = _redeliver(scenario, {"max_takeovers": 2}, 12)
    assert [s for s in seen if s != "in_progress"] == ["killed", "killed", "killed", "held"]
    assert _starts(scenario) == 3  # the first claim and two takeovers ran; not a fourth
    record = idempotent_job.record("PoisonJob", scenario)
    assert record["status"] == "held" and record["takeovers"] == 3
    assert record["last_error"] == REASON
    assert ("PoisonJob", scenario) in idempotent_job.held("PoisonJob", 1000)
    # Held means held: a later delivery does not run it either.
    again = idempotent_job.perform_once("PoisonJob", scenario, lambda c: record_effect(scenario, "1"))
    assert again.decision == "held" and effects(scenario) == 0


def test_without_a_budget_the_poison_operation_keeps_being_reclaimed(scenario):
    seen = _redeliver(scenario, {}, 12)
    assert "held" not in seen
    assert seen.count("killed") >= 5 and _starts(scenario) == seen.count("killed")
    assert idempotent_job.record("PoisonJob", scenario)["status"] == "claimed"


def test_the_held_line_says_why(scenario, caplog):
    with caplog.at_level(logging.WARNING, logger="idempotent_job"):
        # In this process: the first claim is left stale by a killed child, then every
        # takeover here would run; max_takeovers=0 holds the first takeover at once.
        assert _redeliver(scenario, {}, 1) == ["killed"]
        time.sleep(LEASE + 0.2)
        outcome = idempotent_job.perform_once(
            "PoisonJob", scenario, lambda c: record_effect(scenario, "1"), lease=LEASE, max_takeovers=0
        )
    assert outcome.decision == "held" and effects(scenario) == 0
    assert "held for a person: the reclaim budget is spent: 1 stale takeover of this operation" in caplog.text


@pytest.mark.parametrize("value", [-1, 2.5, "2", True])
def test_a_bad_budget_is_refused_by_name(scenario, value):
    with pytest.raises(errors.ConfigurationError, match="max_takeovers must be a whole number from 0"):
        idempotent_job.perform_once("PoisonJob", scenario, lambda c: None, max_takeovers=value)


def test_a_misspelt_budget_gets_the_nearest_name(scenario):
    with pytest.raises(errors.ConfigurationError, match=r"did you mean max_takeovers\?"):
        idempotent_job.perform_once("PoisonJob", scenario, lambda c: None, max_takeover=2)
