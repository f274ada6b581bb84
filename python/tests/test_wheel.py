"""The wheel (built by bin/test-python into tmp/wheels) installs into a fresh venv with no
cargo on PATH and claims against PostgreSQL: the abi3 wheel carries the compiled core."""

from __future__ import annotations

import os
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


def test_the_wheel_installs_and_claims_without_cargo(tmp_path):
    built = sorted((ROOT / "tmp" / "wheels").glob("*.whl"))
    wheel = os.environ.get("IDEMPOTENT_JOB_WHEEL") or (built[-1] if built else None)
    if not wheel:
        pytest.fail("no wheel: run bin/test-python (it builds tmp/wheels/idempotent_job-*.whl)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
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
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": os.environ["DATABASE_URL"], "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(python), "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '["ran", "first", "completed"]'
