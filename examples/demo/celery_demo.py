"""The demo's Celery scenarios, run by bin/demo with the venv's Python:

    .venv/bin/python examples/demo/celery_demo.py

Starts a real ``celery worker`` (prefork pool, 3 children) over the demo's PostgreSQL and
Redis (examples/demo/celery_tasks.py), then delivers operations of the Celery task
``demo_celery.charge_order`` several times:

* (l) the same operation sent 3 times in a row (each after the previous one's result):
  the later two get the first run's stored result;
* (m) 5 copies of one operation sent at once;
* (n) a pool child SIGKILLed inside the body, after its claim and before its effect: the
  message comes back at once (acks_late, task_reject_on_worker_lost), meets the dead
  child's live claim, is sent back for the rest of the lease, then takes the stale claim
  over and runs.

Waits for every result, stops the worker and adds its deliveries to the demo's state file
(DEMO_STATE, default tmp/demo/state.json), so the demo's report shows the three operations
in its effects table. Needs DATABASE_URL and REDIS_URL; the worker's log is
tmp/demo/celery.log. Exit status 0 when every result came back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import celery_tasks  # noqa: E402

STATE = Path(os.environ.get("DEMO_STATE", ROOT / "tmp" / "demo" / "state.json"))
LOG = ROOT / "tmp" / "demo" / "celery.log"
TIMEOUT = 60
AMOUNT_CENTS = 1500


def say(text: str) -> None:
    """Prints a line of the demo at once."""
    print(text, flush=True)


def wait_for(check, what: str, within: float = TIMEOUT):
    """Polls `check` every 0.1 s until it returns a truthy value (returned); raises
    TimeoutError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within} s waiting for {what}")
        time.sleep(0.1)


def start_worker() -> subprocess.Popen:
    """Starts the demo's `celery worker` (prefork, 3 children) and waits until it answers a ping."""
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    command = [
        sys.executable, "-m", "celery", "-A", "celery_tasks", "worker", "--pool=prefork", "--concurrency=3",
        "--loglevel=INFO", f"--logfile={LOG}", "--without-gossip", "--without-mingle",
        f"--hostname=demo-{os.getpid()}@%h",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    worker = subprocess.Popen(command, cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: worker.poll() is not None or celery_tasks.app.control.ping(timeout=0.5), "the worker"
        )
    except TimeoutError:
        stop_worker(worker)
        raise
    if worker.poll() is not None:
        raise RuntimeError(f"the celery worker exited (log: {LOG})")
    return worker


def stop_worker(worker: subprocess.Popen) -> None:
    """Stops the worker: SIGTERM (warm shutdown), SIGKILL after 20 s."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)  # warm shutdown: the children finish what they hold
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def children(worker_pid: int) -> list[int]:
    """The pids of the worker's pool children (Linux /proc)."""
    path = Path(f"/proc/{worker_pid}/task/{worker_pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def main() -> int:
    """Runs (n), (l), (m) as the module's documentation says; returns the exit status."""
    state = json.loads(STATE.read_text())
    run = state["run"]
    task = celery_tasks.charge_order
    orders = {letter: f"{run}-{number}" for letter, number in (("l", 112), ("m", 113), ("n", 114))}
    celery_tasks.app.control.purge()  # messages an interrupted earlier demo left queued
    worker = start_worker()
    try:
        say(f"celery worker pid {worker.pid} started (prefork, children {children(worker.pid)}; log: {LOG})")
        # (n) first: its lease runs out while (l) and (m) go on.
        r = celery_tasks._redis
        r.sadd(celery_tasks.STALL_KEY, orders["n"])
        killed = task.delay(orders["n"], AMOUNT_CENTS)
        pid = int(
            wait_for(lambda: r.hget(celery_tasks.STARTS_KEY + ":pid", orders["n"]), "(n)'s body to start")
        )
        os.kill(pid, signal.SIGKILL)
        say(
            f"(n) {orders['n']}: sent once; pool child pid {pid} claimed it and was SIGKILLed inside "
            "the body, before its effect"
        )

        values = []
        for _ in range(3):
            values.append(task.delay(orders["l"], AMOUNT_CENTS).get(timeout=TIMEOUT))
        say(
            f"(l) {orders['l']}: sent 3 times in a row; results: "
            + ", ".join(f"charged by pid {v['pid']}" for v in values)
            + " (the later two are the first run's stored result)"
        )

        copies = [task.delay(orders["m"], AMOUNT_CENTS) for _ in range(5)]
        pids = [c.get(timeout=TIMEOUT)["pid"] for c in copies]
        say(f"(m) {orders['m']}: 5 copies sent at once; every result says charged by pid {sorted(set(pids))}")

        value = killed.get(timeout=TIMEOUT)
        arrived = int(r.hget(celery_tasks.ARRIVALS_KEY, f"{celery_tasks.TASK_NAME} {orders['n']}") or 0)
        returns = arrived - 2  # the killed delivery and its redelivery; the rest came back deferred
        lease = celery_tasks.LEASE
        how = (
            f"met the dead child's live claim and was sent back {returns} time(s); once the {lease} s lease "
            "ran out it took over the stale claim"
            if returns > 0
            else f"came after the dead child's {lease} s lease had run out and took over the stale claim"
        )
        say(
            f"(n) {orders['n']}: the broker delivered it again (acks_late, task_reject_on_worker_lost); it "
            f"{how}: charged by pid {value['pid']}"
        )
    finally:
        stop_worker(worker)
    deliveries = state["deliveries"]
    for letter, sends in (("l", 3), ("m", 5), ("n", 1)):
        key = f"{celery_tasks.TASK_NAME} {orders[letter]}"
        deliveries[key] = deliveries.get(key, 0) + sends
    STATE.write_text(json.dumps(state, indent=2))
    say("celery worker stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
