"""Effects the tests count: one row per side effect a body performs, written by its own
psycopg connection (committed at once, so a SIGKILL after it cannot undo it)."""

from __future__ import annotations

import os

import psycopg

DATABASE_URL = os.environ.get("DATABASE_URL", "")


def _connect() -> psycopg.Connection:
    return psycopg.connect(DATABASE_URL, autocommit=True)


def setup() -> None:
    with _connect() as c:
        c.execute("CREATE TABLE IF NOT EXISTS py_test_effects (scenario text, key text, pid int)")
        c.execute("CREATE TABLE IF NOT EXISTS py_test_starts (scenario text, key text, pid int)")


def record_effect(scenario: str, key: str) -> None:
    with _connect() as c:
        c.execute("INSERT INTO py_test_effects VALUES (%s, %s, %s)", (scenario, key, os.getpid()))


def effects(scenario: str, key: str | None = None) -> int:
    with _connect() as c:
        if key is None:
            row = c.execute(
                "SELECT count(*) FROM py_test_effects WHERE scenario = %s", (scenario,)
            ).fetchone()
        else:
            row = c.execute(
                "SELECT count(*) FROM py_test_effects WHERE scenario = %s AND key = %s", (scenario, key)
            ).fetchone()
        return row[0]


def record_start(scenario: str, key: str) -> int:
    """Notes that a body started in this process; returns how many starts there were."""
    with _connect() as c:
        c.execute("INSERT INTO py_test_starts VALUES (%s, %s, %s)", (scenario, key, os.getpid()))
        row = c.execute(
            "SELECT count(*) FROM py_test_starts WHERE scenario = %s AND key = %s", (scenario, key)
        ).fetchone()
        return row[0]


def first_start_pid(scenario: str, key: str) -> int | None:
    with _connect() as c:
        row = c.execute(
            "SELECT pid FROM py_test_starts WHERE scenario = %s AND key = %s LIMIT 1", (scenario, key)
        ).fetchone()
        return row[0] if row else None


def pids(scenario: str) -> dict[str, list[int]]:
    """The pids that started a body and did an effect in `scenario`, in insertion order
    (for a failing test's explanation)."""
    with _connect() as c:
        return {
            table: [
                row[0]
                for row in c.execute(f"SELECT pid FROM py_test_{table} WHERE scenario = %s", (scenario,))
            ]
            for table in ("starts", "effects")
        }
