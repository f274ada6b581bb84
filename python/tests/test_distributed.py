"""The distributed profile (``compatibility="distributed"``, docs/scaling.md) from Python:
the setting is the core's (checked there), and the plain API works under it."""

from __future__ import annotations

import os
import uuid

import pytest

import idempotent_job
from idempotent_job.errors import ConfigurationError


@pytest.fixture
def distributed():
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"], compatibility="distributed")
    try:
        yield
    finally:
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"])


def test_a_delivery_runs_once_under_the_distributed_profile(distributed):
    key = f"d-{uuid.uuid4()}"
    runs = []
    first = idempotent_job.perform_once("PyDistributed", key, lambda claim: runs.append(1) or "ran")
    again = idempotent_job.perform_once("PyDistributed", key, lambda claim: runs.append(1))
    assert (first.decision, again.decision, runs) == ("ran", "completed", [1])


def test_an_unknown_compatibility_is_refused_naming_the_values():
    refused = '^compatibility must be one of postgresql, distributed, got "cockroach"$'
    with pytest.raises(ConfigurationError, match=refused):
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"], compatibility="cockroach")
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
