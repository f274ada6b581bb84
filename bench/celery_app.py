"""The Celery app of the Celery benchmark (bench/celery_bench.py), loaded by a real
``celery worker`` (prefork pool, Redis broker) and by the producer.

One no-op task per variant, each counting its effect (a Redis HINCRBY per operation key)
when its body runs:

* ``bench.none``: no guard;
* ``bench.door``: idempotent_job's Celery door (``IdempotentTask``, the defaults of
  ``configure``: durable commits, heartbeat, the return value stored);
* ``bench.handwritten``: what a team writes with psycopg: ``INSERT … ON CONFLICT DO
  NOTHING RETURNING`` into a narrow table of its own (a conflict skips the body), then an
  ``UPDATE`` on completion; autocommit (each a durable commit), prepared statements, one
  connection per pool child. No stale-claim handling, payload check or stored result;
* ``bench.once``: celery-once's ``QueueOnce`` (``graceful``, keyed on the operation key):
  a Redis lock taken at ``apply_async`` and cleared when the task returns.

Signals time the run: each pool child notes its first task's start (monotonic clock, which
is system-wide on Linux), every task's end bumps a counter (and a retry counter when the
door sent the delivery back) and notes the time, per child. Settings from the environment:
``BENCH_BROKER_URL`` (a Redis database the benchmark may flush), ``DATABASE_URL``.
"""

from __future__ import annotations

import os
import time

import idempotent_job
import psycopg
import redis
from celery import Celery, signals
from celery_once import QueueOnce
from idempotent_job.celery import IdempotentTask

BROKER_URL = os.environ["BENCH_BROKER_URL"]
DATABASE_URL = os.environ["DATABASE_URL"]
#: The queue the benchmark's tasks go to.
QUEUE = "bench_celery"
#: The hand-written guard's table.
GUARD_TABLE = "bench_celery_guard"
#: Redis keys of the run's figures.
EFFECTS = "bench:effects"
ENDED = "bench:ended"
RETRIED = "bench:retried"
STARTS = "bench:starts"
LAST = "bench:last"

app = Celery("idempotent_job_bench", broker=BROKER_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,  # what the door needs; the same for every variant
    task_reject_on_worker_lost=True,
    task_ignore_result=True,  # no result backend: the door keeps its own stored result
    broker_transport_options={"visibility_timeout": 3600},
    worker_hijack_root_logger=False,
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": BROKER_URL, "default_timeout": 3600}},
)

idempotent_job.configure(database_url=DATABASE_URL)

_redis = redis.Redis.from_url(BROKER_URL)  # redis-py rebuilds its pool in a forked child
_child = {"started": False}
_guard: dict[str, psycopg.Connection | int | None] = {"pid": None, "conn": None}


def _effect(key: str) -> None:
    _redis.hincrby(EFFECTS, key, 1)


@app.task(name="bench.none")
def none(key):
    """No guard: the effect on every delivery."""
    _effect(key)


@app.task(name="bench.door", base=IdempotentTask, idempotency_key="key")
def door(key):
    """The effect behind idempotent_job's Celery door (key: the argument `key`)."""
    _effect(key)


def _guard_connection() -> psycopg.Connection:
    if _guard["pid"] != os.getpid():  # one connection per pool child, opened after the fork
        _guard["conn"] = psycopg.connect(DATABASE_URL, autocommit=True)
        _guard["pid"] = os.getpid()
    return _guard["conn"]


@app.task(name="bench.handwritten")
def handwritten(key):
    """The effect behind the hand-written guard: claim by INSERT, skip on conflict, UPDATE after."""
    conn = _guard_connection()
    claimed = conn.execute(
        f"INSERT INTO {GUARD_TABLE} (operation_key, status, claimed_at) VALUES (%s, 'running', now()) "
        "ON CONFLICT DO NOTHING RETURNING 1",
        (key,),
        prepare=True,
    ).fetchone()
    if claimed is None:
        return  # a duplicate: the operation was claimed before (running or done)
    _effect(key)
    conn.execute(
        f"UPDATE {GUARD_TABLE} SET status = 'done', completed_at = now() WHERE operation_key = %s",
        (key,),
        prepare=True,
    )


@app.task(name="bench.once", base=QueueOnce, once={"graceful": True, "keys": ["key"]})
def once(key):
    """The effect behind celery-once's lock (taken at apply_async, cleared on return)."""
    _effect(key)


#: The task of each variant.
TASKS = {"none": none, "door": door, "handwritten": handwritten, "once": once}


@signals.task_prerun.connect
def _started(**_kwargs) -> None:
    if not _child["started"]:
        _child["started"] = True
        _redis.rpush(STARTS, repr(time.monotonic()))


@signals.task_postrun.connect
def _ended(state=None, **_kwargs) -> None:
    pipe = _redis.pipeline(transaction=False)
    pipe.incr(ENDED)
    if state == "RETRY":
        pipe.incr(RETRIED)
    pipe.hset(LAST, str(os.getpid()), repr(time.monotonic()))  # each child's last end
    pipe.execute()


def setup_guard_table() -> None:
    """Creates the hand-written guard's table (and empties it)."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {GUARD_TABLE} (operation_key text PRIMARY KEY, "
            "status text NOT NULL, claimed_at timestamptz NOT NULL, completed_at timestamptz)"
        )
        conn.execute(f"TRUNCATE {GUARD_TABLE}")


def celery_version() -> str:
    """Celery's version, for the table's title."""
    import celery

    return celery.__version__
