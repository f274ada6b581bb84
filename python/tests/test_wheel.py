"""The wheel (built by bin/test-python into tmp/wheels) installs into a fresh venv with no
cargo on PATH and claims against PostgreSQL: the abi3 wheel carries the compiled core. It
also runs on the oldest Python the package claims (3.9), when that interpreter is here."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = """
import json, os, shutil, sys, uuid
assert shutil.which("cargo") is None and shutil.which("rustc") is None, "cargo is on PATH"
import idempotent_job
assert idempotent_job.__file__.startswith(sys.prefix), idempotent_job.__file__
idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
idempotent_job.migrate()
key = str(uuid.uuid4())
first = idempotent_job.perform_once("WheelCheck", key, lambda claim: claim.kind)
again = idempotent_job.perform_once("WheelCheck", key, lambda claim: 1 / 0)
print(json.dumps([first.decision, first.value, again.decision]))
"""


def _wheel():
    built = sorted((ROOT / "tmp" / "wheels").glob("*.whl"))
    wheel = os.environ.get("IDEMPOTENT_JOB_WHEEL") or (built[-1] if built else None)
    if not wheel:
        pytest.fail("no wheel: run bin/test-python (it builds tmp/wheels/idempotent_job-*.whl)")
    return wheel


def _install(interpreter, wheel, tmp_path):
    """A fresh venv of ``interpreter`` with only the wheel installed; its python."""
    venv = tmp_path / "venv"
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        timeout=120,
    )
    return python


def _run(python, script, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": os.environ["DATABASE_URL"], "HOME": str(tmp_path)}
    return subprocess.run(
        [str(python), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_wheel_installs_and_claims_without_cargo(tmp_path):
    python = _install(sys.executable, _wheel(), tmp_path)
    done = _run(python, SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '["ran", "first", "completed"]'


# On the oldest Python the package claims (pyproject's requires-python, the cp39 abi3
# tag): every module imports and the plain API, the repeats report and the Celery door's
# key reading run. Celery itself is not installed there (the venv has the wheel alone): a
# stand-in of the three names the door imports lets its module run its top level, which
# is where a 3.10-only construct (``int | None`` outside an annotation) would fail.
OLDEST_SCRIPT = """
import json, os, sys, types, uuid
assert sys.version_info[:2] == (3, 9), sys.version
celery = types.ModuleType("celery")
exceptions = types.ModuleType("celery.exceptions")
celery.Task = type("Task", (), {"name": None})
celery.current_app = None
exceptions.Ignore = type("Ignore", (Exception,), {})
exceptions.Retry = type("Retry", (Exception,), {})
celery.exceptions = exceptions
sys.modules.update({"celery": celery, "celery.exceptions": exceptions})
import idempotent_job
import idempotent_job.celery
import idempotent_job.errors
import idempotent_job.sqs

class Charge(idempotent_job.celery.IdempotentTask):
    name = "OldestCharge"
    idempotency_key = ["order_id", "shop.id"]
    def run(self, order_id, shop):
        return order_id

key = Charge()._operation_key((42,), {"shop": {"id": 7}})
idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
idempotent_job.migrate()
job_type = "OldestPython" + uuid.uuid4().hex
first = idempotent_job.perform_once(job_type, 1, lambda claim: "one", store_result=True)
again = idempotent_job.perform_once(job_type, 1, lambda claim: 1 / 0, store_result=True)
report = idempotent_job.repeats_report(job_type=job_type)
print(json.dumps([key, first.decision, again.decision, again.value, len(report.operations)]))
"""


def _oldest_python():
    """A CPython 3.9 interpreter that runs: IDEMPOTENT_JOB_PYTHON39, python3.9 on PATH, or
    pyenv's (a pyenv shim on PATH may name a version it will not run)."""
    found = [os.environ.get("IDEMPOTENT_JOB_PYTHON39"), shutil.which("python3.9")]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")))
    for path in filter(None, found):
        probe = subprocess.run(
            [path, "-c", "import sys; print(sys.version_info[:2] == (3, 9))"], capture_output=True, text=True
        )
        if probe.stdout.strip() == "True":
            return path
    return None


def test_the_wheel_runs_on_the_oldest_python_it_claims(tmp_path):
    interpreter = _oldest_python()
    if interpreter is None:
        pytest.skip("no CPython 3.9 (IDEMPOTENT_JOB_PYTHON39, python3.9 on PATH, ~/.pyenv/versions/3.9*)")
    python = _install(interpreter, _wheel(), tmp_path)
    done = _run(python, OLDEST_SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ['["42","7"]', "ran", "completed", "one", 1]
