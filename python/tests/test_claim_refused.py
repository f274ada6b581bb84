"""A worker whose URL the server refuses: a wrong password (28P01: bin/services makes the
role idempotent_job_password_probe give one), a role that does not exist (28000), a database
that does not exist (3D000). The delivery's error names its task and operation, as a missing
table's does, keeps its class (DatabaseError, not retryable, sent back to its queue), never
shows the password, and the body does not run. spec/faults/claim_refused_spec.rb asserts the
same of the Ruby gem."""

from __future__ import annotations

import os
import re

import psycopg
import pytest

import idempotent_job
from idempotent_job import errors

PROBE = "idempotent_job_password_probe"
BASE = os.environ["DATABASE_URL"]


def _with_user(url: str, user: str) -> str:
    return re.sub(r"://[^@/]*@", f"://{user}@", url, count=1)


URLS = {
    "28P01": _with_user(BASE, f"{PROBE}:wrong-secret"),
    "28000": _with_user(BASE, "no_such_role_here"),
    "3D000": re.sub(r"/[^/?]+(\?|$)", r"/no_such_database_here\1", BASE, count=1),
}


@pytest.fixture(scope="module", autouse=True)
def probe_role():
    """The role that must give its password (created once; its password is 'right')."""
    with psycopg.connect(BASE, autocommit=True) as c:
        c.execute("SET password_encryption = 'scram-sha-256'")
        try:
            c.execute(f"CREATE ROLE {PROBE} LOGIN PASSWORD 'right'")
        except psycopg.errors.DuplicateObject:
            pass
    yield
    idempotent_job.configure(database_url=BASE)


@pytest.mark.parametrize("state", sorted(URLS))
def test_a_refused_claim_names_the_task_and_the_operation(state, scenario):
    idempotent_job.configure(database_url=URLS[state], deadline=5)
    ran = []
    with pytest.raises(errors.IdempotentJobError) as raised:
        idempotent_job.perform_once("ClaimRefusedTask", scenario, lambda claim: ran.append(1))
    error = raised.value
    if state == "28P01" and getattr(error, "sqlstate", None) == "28000":
        pytest.skip(f"this server does not ask {PROBE} for a password (bin/services' pg_hba line)")
    assert isinstance(error, errors.DatabaseError), repr(error)
    assert error.sqlstate == state
    text = str(error)
    assert text.startswith(f'cannot claim ClaimRefusedTask operation "{scenario}": '), text
    assert text.count("cannot claim") == 1, text
    assert "check database_url" in text and "wrong-secret" not in text, text
    assert not error.retryable and error.sends_back
    assert ran == []
