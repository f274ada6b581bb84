"""The package's types as a user's type checker sees them (issue 32): a user's file that
uses perform_once, IdempotentTask, Outcome, Claim and the errors passes `mypy --strict`
against the installed package (py.typed and the native module's stub), and a misuse is
caught (so the check can fail)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

USER_FILE = textwrap.dedent(
    """
    from __future__ import annotations

    import idempotent_job
    from idempotent_job import Claim, Outcome, errors


    def charge(claim: Claim) -> dict[str, str]:
        return {"charged": claim.operation_key, "kind": claim.kind}


    def run(order_id: int) -> str | None:
        outcome: Outcome = idempotent_job.perform_once("ChargeOrder", order_id, charge, lease=60)
        if outcome.ran and outcome.claim is not None:
            return outcome.claim.token
        try:
            idempotent_job.perform_once("ChargeOrder", order_id, charge)
        except errors.IdempotentJobError as error:
            return str(error)
        return outcome.decision


    version: str = idempotent_job.__version__
    """
)

MISUSE = "import idempotent_job\nx: int = idempotent_job.__version__\n"


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "user_code.py"
    path.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )


def test_a_users_file_passes_mypy_strict(tmp_path):
    done = _mypy(tmp_path, USER_FILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_catches_a_misuse(tmp_path):
    done = _mypy(tmp_path, MISUSE)
    assert done.returncode == 1 and "incompatible types" in done.stdout.lower(), done.stdout


def test_version_is_the_workspaces():
    import idempotent_job

    cargo = (Path(__file__).parents[2] / "Cargo.toml").read_text()
    assert f'version = "{idempotent_job.__version__}"' in cargo
