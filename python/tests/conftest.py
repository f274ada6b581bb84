"""Shared fixtures: the suite's PostgreSQL (DATABASE_URL) and Redis (REDIS_URL), from
`bin/services start`; every test gets a fresh scenario name so records never collide."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import effects  # noqa: E402

import idempotent_job  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("DATABASE_URL"):
        raise pytest.UsageError('DATABASE_URL is required: eval "$(bin/services start tmp/svc)"')


@pytest.fixture(scope="session", autouse=True)
def database() -> None:
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
    idempotent_job.migrate()
    effects.setup()


@pytest.fixture
def scenario() -> str:
    return "s" + uuid.uuid4().hex[:12]


def eventually(check, what: str, within: float = 60.0, every: float = 0.1, explain=None):
    """Polls `check` until it returns a truthy value (returned), failing after `within`
    seconds with `what` (a bound on a wait, not an assertion about speed) and, when given,
    what `explain()` (called only then) says about the state left."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}" + (f"\n{explain()}" if explain else ""))
        time.sleep(every)


def postgresql_pids() -> list[int]:
    """The test PostgreSQL's postmaster and its children (backends, background processes)."""
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"]) as c:
        data = c.execute("SHOW data_directory").fetchone()[0]
    postmaster = int(Path(data, "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *map(int, children)]


def signal_all(pids: list[int], signum: int) -> None:
    """Sends `signum` to each of `pids` that still runs (a backend may have ended since)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


#: moto_server's port (an SQS emulator from PyPI): the helper's MOTO_PORT.
MOTO_PORT = int(os.environ.get("MOTO_PORT", "25458"))


@pytest.fixture(scope="module")
def sqs():
    """A boto3 SQS client of a moto_server started for the module (an emulator, not AWS)."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", MOTO_PORT)) == 0:
            raise RuntimeError(f"port {MOTO_PORT} is taken by another process: set MOTO_PORT to a free port")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(MOTO_PORT), "-H", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = boto3.client(
        "sqs",
        endpoint_url=f"http://127.0.0.1:{MOTO_PORT}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )

    def up():
        try:
            client.list_queues()
            return True
        except Exception:
            return False

    try:
        eventually(up, "moto_server to answer", 30, 0.2)
        # A port taken meanwhile: this moto_server exits, and another process answers in its place.
        if process.poll() is not None:
            raise RuntimeError(
                f"moto_server exited (status {process.returncode}) though port {MOTO_PORT} answers: another "
                f"process holds it; set MOTO_PORT to a free port"
            )
        yield client
    finally:
        process.terminate()
        process.wait(10)
