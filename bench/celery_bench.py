"""The Celery benchmark (issue 22), run by ``bin/bench --only celery`` (bench/celery_run.rb)
or on its own with the venv's Python:

    .venv/bin/python bench/celery_bench.py --operations 5000 --rounds 3 [--json OUT] [--dir DIR]

A real ``celery worker`` (prefork pool, Redis broker, durable PostgreSQL) drains N
operations plus 30 % duplicates (sends of an operation key already sent, each a few
hundred sends behind its original), once per variant (bench/celery_app.py: no guard,
idempotent_job's door, a hand-written psycopg guard, celery-once). Each run starts a fresh
worker, then the producer sends the messages in order while the worker drains them (so a
duplicate meets its original queued, running or done, as in production); the drain time
runs from the first task's start to the last task's end. The variants' order rotates every
round; ratios are taken per round and their median printed. Needs DATABASE_URL and
REDIS_URL (it flushes Redis database 7 of that server). Writes the table and the figures
as JSON to --json for the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
#: Duplicate sends, as a fraction of the operations.
DUPLICATES = 0.3
#: Random seed of where the duplicates go (reproducible runs).
SEED = 22
#: The variants, in the first round's order; each later round rotates it by one.
VARIANTS = ["none", "door", "handwritten", "once"]
LABELS = {
    "none": "no guard",
    "door": "idempotent_job: IdempotentTask",
    "handwritten": "hand-written psycopg guard",
    "once": "celery-once 3.0.1 (QueueOnce, graceful)",
}


def broker_url() -> str:
    """REDIS_URL's server, database 7 (the benchmark's: it is emptied before each run)."""
    return urlunsplit(urlsplit(os.environ["REDIS_URL"])._replace(path="/7"))


os.environ.setdefault("BENCH_BROKER_URL", broker_url())
sys.path.insert(0, str(HERE))

import celery_app  # noqa: E402
import idempotent_job  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402


class Bench:
    """One benchmark: N operations + DUPLICATES, ROUNDS rounds of every variant."""

    def __init__(self, operations: int, rounds: int, concurrency: int, out_dir: Path):
        self.operations = operations
        self.duplicates = round(operations * DUPLICATES)
        self.sends = operations + self.duplicates
        self.rounds = rounds
        self.concurrency = concurrency
        self.dir = out_dir.resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.redis = redis.Redis.from_url(os.environ["BENCH_BROKER_URL"])

    @property
    def gap(self) -> int:
        """The least distance, in sends, of a duplicate behind its original."""
        return max(self.operations // 20, 10)

    def order(self, prefix: str) -> list[str]:
        """The operation keys in send order: every operation once, and DUPLICATES of them
        again, each gap to 3 × gap sends behind its original."""
        rng = random.Random(SEED)
        slots = [(float(i), f"{prefix}{i}") for i in range(1, self.operations + 1)]
        candidates = range(1, self.operations - 3 * self.gap + 1)
        for i in rng.sample(candidates, self.duplicates):
            slots.append((i + self.gap + rng.random() * 2 * self.gap, f"{prefix}{i}"))
        return [key for _, key in sorted(slots)]

    def run(self) -> dict:
        """Runs every round; returns the table and figures (see :meth:`figures`).
        Raises RuntimeError when a run fails its checks or a worker fails."""
        idempotent_job.migrate()
        celery_app.setup_guard_table()
        samples: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for r in range(self.rounds):
            order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
            for variant in order:
                samples[variant].append(self.once(variant, f"{r}{variant}"))
        return self.figures(samples)

    def once(self, variant: str, run_id: str) -> dict:
        """One run of one variant: queue the sends, start a worker, time the drain, send the
        late duplicates, stop the worker, check the effects. Returns the run's figures."""
        prefix = f"c{os.getpid()}-{run_id}-"
        self.redis.flushdb()
        log = self.dir / f"celery-{run_id}.log"
        task = celery_app.TASKS[variant]
        order = self.order(prefix)
        accepted, sending = self.send(task, order)
        worker = self.start_worker(log)
        try:
            figures = self.wait(accepted, worker, log)
            # Late duplicates: every duplicate sent once more, now that its original is done.
            late = [key for key, n in _counts(order).items() if n > 1]
            late_accepted, _ = self.send(task, late)
            after = self.wait(accepted + late_accepted, worker, log)
        finally:
            self.stop(worker)
        figures.update(variant=variant, accepted=accepted, sending=sending, late=len(late),
                       late_accepted=late_accepted, late_effects=after["effects"] - figures["effects"],
                       late_twice=after["twice"] - figures["twice"], after=after)  # fmt: skip
        self.check(variant, prefix, figures, log)
        print(
            f"   {LABELS[variant]}: {self.sends} sends ({accepted} queued) in {sending:.2f} s; "
            f"{figures['tasks']} tasks in {figures['seconds']:.2f} s, "
            f"{self.sends / figures['seconds']:.0f} sends/s; "
            f"effects {figures['effects']} ({figures['twice']} operations more than once); {len(late)} late "
            f"duplicates: {late_accepted} queued, {figures['late_effects']} effects",
            flush=True,
        )
        return figures

    def send(self, task, keys: list[str]) -> tuple[int, float]:
        """Sends one message per key; returns how many were queued (celery-once's graceful
        lock returns a REJECTED result instead) and the seconds it took."""
        started = time.monotonic()
        accepted = 0
        for key in keys:
            result = task.apply_async((key,))
            accepted += getattr(result, "state", None) != "REJECTED"
        return accepted, time.monotonic() - started

    def start_worker(self, log: Path) -> subprocess.Popen:
        """Starts `celery worker` (prefork) on the benchmark's queue, its log in `log`."""
        command = [
            sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=prefork",
            f"--concurrency={self.concurrency}", f"--queues={celery_app.QUEUE}", "--loglevel=WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            f"--hostname=bench-{os.getpid()}@%h",
            f"--logfile={log}",
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
        return subprocess.Popen(command, cwd=HERE, env=env, **quiet)

    def wait(self, accepted: int, worker: subprocess.Popen, log: Path) -> dict:
        """Waits until `accepted` tasks have ended (deferred copies awaited); returns tasks,
        deferred, seconds (first start to last end), effects, operations, twice, most.
        Raises RuntimeError when the worker exits or takes too long."""
        deadline = time.monotonic() + 120 + accepted / 50
        while True:
            ended, retried = (int(v or 0) for v in self.redis.mget(celery_app.ENDED, celery_app.RETRIED))
            if ended - retried >= accepted:
                break
            if worker.poll() is not None:
                raise RuntimeError(f"the celery worker exited early (log: {log})")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the worker ended {ended - retried} of {accepted} tasks in time (log: {log})"
                )
            time.sleep(0.05)
        starts = [float(v) for v in self.redis.lrange(celery_app.STARTS, 0, -1)]
        last = max(float(v) for v in self.redis.hvals(celery_app.LAST))
        counts = [int(v) for v in self.redis.hvals(celery_app.EFFECTS)]
        return {
            "tasks": ended,
            "deferred": retried,
            "seconds": last - min(starts),
            "effects": sum(counts),
            "operations": len(counts),
            "twice": sum(1 for n in counts if n > 1),
            "most": max(counts, default=0),
        }

    @staticmethod
    def stop(worker: subprocess.Popen) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL after 15 s."""
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def check(self, variant: str, prefix: str, figures: dict, log: Path) -> None:
        """Raises RuntimeError unless every operation ran, exactly once with the door and the
        hand-written guard (late duplicates included), every send without a guard."""
        after = figures["after"]
        if figures["operations"] != self.operations:
            raise RuntimeError(
                f"{variant}: {figures['operations']} of {self.operations} operations ran (log: {log})"
            )
        if variant == "none" and after["effects"] != self.sends + figures["late"]:
            raise RuntimeError(
                f"no guard: {after['effects']} effects for {self.sends + figures['late']} sends (log: {log})"
            )
        if variant in ("door", "handwritten") and (after["effects"], after["most"]) != (self.operations, 1):
            raise RuntimeError(
                f"{variant}: {after['effects']} effects for {self.operations} operations, most for one "
                f"{after['most']} (log: {log})"
            )
        if variant == "door":
            with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
                completed = conn.execute(
                    "SELECT count(*) FROM idempotent_job_records WHERE job_type = 'bench.door' "
                    "AND status = 'completed' AND operation_key LIKE %s",
                    (prefix + "%",),
                ).fetchone()[0]
            if completed != self.operations:
                raise RuntimeError(f"door: {completed} of {self.operations} records completed (log: {log})")

    def figures(self, samples: dict[str, list[dict]]) -> dict:
        """The table (title, headers, rows, notes) and the CSV records (subject, metric,
        value, unit, note) of every variant's runs."""
        rate = {v: [self.sends / s["seconds"] for s in runs] for v, runs in samples.items()}

        def ratio(a: str, b: str) -> float:
            return statistics.median(x / y for x, y in zip(rate[a], rate[b]))

        def runs(values) -> str:
            return " ".join(f"{x:.0f}" for x in values)

        rows, records = [], []
        for v in VARIANTS:
            last = samples[v][-1]
            median = statistics.median(rate[v])
            seconds = statistics.median(s["seconds"] for s in samples[v])
            tasks = statistics.median(s["tasks"] / s["seconds"] for s in samples[v])
            cells = [LABELS[v], str(last["accepted"]), str(last["tasks"]), f"{seconds:.2f}", f"{tasks:.0f}"]
            cells += [f"{median:.0f}"] + [
                f"{ratio(v, other):.2f}×" for other in ("none", "handwritten", "once")
            ]
            cells += [
                self.effects_text(v, last),
                f"{last['late_accepted']} queued, {last['late_effects']} effects",
            ]
            cells += [runs(rate[v])]
            rows.append(cells)
            records += [
                [v, "sends_per_s", round(median, 1), "1/s", f"runs: {runs(rate[v])}"],
                [v, "tasks_per_s", round(tasks, 1), "1/s", f"tasks run in the drain: {last['tasks']}"],
                [v, "drain_seconds", round(seconds, 3), "s", f"{self.sends} sends"],
                [v, "effects", last["effects"], "", f"operations run more than once: {last['twice']}"],
                [v, "late_duplicate_effects", last["late_effects"], "", f"of {last['late']} late duplicates"],
            ]
            records += [
                [v, f"ratio_to_{o}", round(ratio(v, o), 3), "x", None]
                for o in ("none", "handwritten", "once")
            ]
        title = (
            f"Celery: a real celery worker (Celery {celery_app.celery_version()}, "
            f"prefork -c {self.concurrency}, "
            f"Redis broker, durable PostgreSQL): {self.operations} operations + {self.duplicates} duplicates "
            f"({self.sends} sends)"
        )
        headers = ["variant", "queued", "tasks run", "drain s (median)", "tasks/s (median)",
                   "sends/s (median)", "× no guard", "× hand-written", "× celery-once", "effects run",
                   "late duplicates", "each run (sends/s)"]  # fmt: skip
        return {
            "title": title,
            "headers": headers,
            "rows": rows,
            "notes": self.notes(samples),
            "records": records,
        }

    def effects_text(self, variant: str, last: dict) -> str:
        """The effects cell of a variant's row (its last run)."""
        text = f"{last['effects']} ({last['twice']} operations more than once)"
        if variant == "door" and last["deferred"]:
            text += f"; {last['deferred']} deferred behind a live claim"
        return text

    def notes(self, samples: dict[str, list[dict]]) -> list[str]:
        """The lines under the table: method, settings, checks, celery-once's behaviour."""
        sending = {v: statistics.median(s["sending"] for s in runs) for v, runs in samples.items()}
        return [
            f"each run: the {self.sends} sends queued first (each duplicate {self.gap}–{3 * self.gap} "
            "sends behind its original), then a fresh worker started; timed from the first task's start "
            f"to the last one's end; {self.rounds} rounds, the variants' order rotating; sends/s = "
            f"{self.sends} / drain time; × = median of the per-round ratios of sends/s. Sending took "
            "(median s, producer side, not timed): "
            + ", ".join(f"{LABELS[v]} {sending[v]:.2f}" for v in VARIANTS)
            + ".",
            "every variant: acks_late, task_reject_on_worker_lost, no result backend, "
            "--loglevel=WARNING; each body counts its effect in Redis (HINCRBY), and each task's end is "
            "counted in Redis (one round trip).",
            "late duplicates: after the drain, each duplicated operation sent once more (its first run is "
            "over), not timed. idempotent_job and the hand-written guard are checked: every operation's "
            "effect ran exactly once, late duplicates included (and the door's records are completed). "
            "The hand-written guard skips any conflict, so a duplicate of a claim whose worker died is "
            "lost, not run (no lease, no stale claim, no payload check, no stored result).",
            "celery-once is a Redis lock taken at apply_async and cleared when the task returns: it drops "
            "a send while the first is queued or running (here every duplicate: their originals were "
            "still queued) and lets a send after the first run ended run again (late duplicates: "
            + ", ".join(f"{s['late_effects']} of {s['late']}" for s in samples["once"])
            + " ran a second effect, per round).",
        ]


def _counts(keys: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--dir", type=Path, default=HERE.parent / "tmp" / "bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = Bench(args.operations, args.rounds, args.concurrency, args.dir).run()
    if args.json:
        args.json.write_text(json.dumps(figures))
    else:
        print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
