"""Bounds that hold while PostgreSQL accepts connections and never answers (SIGSTOP of
the postmaster and every backend; issue 29 item 5): a call with ``wait=N`` returns or
raises within N seconds plus the core's margin, not the 10 s deadline; after one call
spent its deadline the circuit fails the next ones at once (a door sends them back);
once PostgreSQL answers again, calls succeed on their own."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import eventually, postgresql_pids, signal_all

import idempotent_job
from idempotent_job import errors

# The bound asserted: the wait + the core's 0.5 s margin + 1 s for a loaded machine.
SLACK = 1.5


@pytest.fixture
def frozen():
    """PostgreSQL stopped (SIGSTOP) for the test; resumed (SIGCONT) after it, whatever happens."""
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"], deadline=10)
    idempotent_job.perform_once("Outage", "warm", lambda claim: None)  # a pooled connection
    pids = postgresql_pids()
    signal_all(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        signal_all(pids, signal.SIGCONT)
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"])


def _timed(call):
    started = time.monotonic()
    try:
        return call(), time.monotonic() - started
    except errors.IdempotentJobError as error:
        return error, time.monotonic() - started


def test_wait_bounds_the_call_and_the_circuit_fails_fast_then_recovers(frozen, scenario):
    ran = []
    outcome, seconds = _timed(
        lambda: idempotent_job.perform_once("Outage", scenario, lambda claim: ran.append(1), wait=2)
    )
    # Before: the 10 s deadline (raised after ~10 s whatever the wait).
    assert isinstance(outcome, (errors.TimeoutError, errors.ConnectionError)), outcome
    assert seconds <= 2 + SLACK, f"wait=2 raised after {seconds:.2f} s"
    assert outcome.sends_back and outcome.retryable
    # The circuit is open: the next call fails at once, naming the last failure.
    outcome, seconds = _timed(
        lambda: idempotent_job.perform_once("Outage", scenario, lambda _: ran.append(1))
    )
    assert isinstance(outcome, errors.ConnectionError), outcome
    assert "circuit open" in str(outcome) and outcome.sends_back
    assert seconds < 0.5, f"an open circuit took {seconds:.2f} s"
    assert ran == []


def test_calls_succeed_again_once_postgresql_answers(scenario):
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"], deadline=2)
    try:
        idempotent_job.perform_once("Outage", "warm", lambda claim: None)
        pids = postgresql_pids()
        signal_all(pids, signal.SIGSTOP)
        try:
            with pytest.raises((errors.TimeoutError, errors.ConnectionError)):
                idempotent_job.perform_once("Outage", scenario, lambda claim: None)
        finally:
            signal_all(pids, signal.SIGCONT)
        ran = []

        def attempt():
            try:
                outcome = idempotent_job.perform_once("Outage", scenario + "-after", lambda c: ran.append(1))
                return outcome.decision
            except errors.ConnectionError:
                return None  # the circuit, until its open time passes

        assert eventually(attempt, "a call to succeed after the outage", 10) == "ran"
        assert ran == [1]
    finally:
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
