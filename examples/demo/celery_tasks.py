"""The demo's Celery app (bin/demo, scenarios (l) (m) (n)): a real ``celery worker``
(prefork pool) over the demo's PostgreSQL and Redis, with idempotent_job's Celery door.

``charge_order`` is the README's charge as a Celery task: its effect is a row in
``demo_charges`` (the table the Sidekiq jobs' charges go to), written by its own psycopg
connection and committed at once. Every delivery reaching the worker is counted in the
demo's arrivals hash (as the Sidekiq worker's Demo::Arrivals does). The broker and result
backend are Redis database 4 of REDIS_URL's server (Sidekiq uses REDIS_URL's).
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit, urlunsplit

import idempotent_job
import psycopg
import redis
from celery import Celery, signals
from idempotent_job.celery import IdempotentTask

#: The record's job type of the demo's Celery task.
TASK_NAME = "demo_celery.charge_order"
#: Its lease, seconds: short, so a redelivery behind a killed child's claim runs within the demo, and
#: longer than the few seconds billiard takes to notice the killed child, so the redelivery meets the
#: live claim first.
LEASE = 6
#: How long the body works before its effect, so copies overlap.
WORK_SECONDS = 0.8
#: Redis keys shared with the Ruby side (examples/demo/jobs.rb) and the Celery driver.
ARRIVALS_KEY = "idempotent_job_demo:arrivals"
STARTS_KEY = "idempotent_job_demo:celery_starts"
STALL_KEY = "idempotent_job_demo:celery_stall"

SIDEKIQ_REDIS = os.environ["REDIS_URL"]
BROKER_URL = urlunsplit(urlsplit(SIDEKIQ_REDIS)._replace(path="/4"))
DATABASE_URL = os.environ["DATABASE_URL"]

app = Celery("idempotent_job_demo", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    task_acks_late=True,  # acknowledged after the task: a lost child's message is delivered again
    task_reject_on_worker_lost=True,  # ... at once, when the pool child dies
    worker_prefetch_multiplier=1,
    broker_transport_options={"visibility_timeout": 3600},  # far longer than the lease
    result_expires=3600,
    worker_hijack_root_logger=False,
)

idempotent_job.configure(database_url=DATABASE_URL, lease=LEASE)

_redis = redis.Redis.from_url(SIDEKIQ_REDIS, decode_responses=True)


@app.task(name=TASK_NAME, base=IdempotentTask, idempotency_key="order_id", idempotency_lease=LEASE)
def charge_order(order_id, amount_cents):
    """Charges an order once: a row in demo_charges. The first start of an order listed in
    the stall set hangs before its effect (the demo SIGKILLs its pool child there)."""
    starts = _redis.hincrby(STARTS_KEY, order_id, 1)
    if starts == 1 and _redis.sismember(STALL_KEY, order_id):
        _redis.hset(STARTS_KEY + ":pid", order_id, os.getpid())
        time.sleep(120)
    time.sleep(WORK_SECONDS)
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO demo_charges (job_type, order_id, amount_cents, pid) VALUES (%s, %s, %s, %s)",
            (TASK_NAME, order_id, amount_cents, os.getpid()),
        )
    return {"charged": order_id, "pid": os.getpid()}


@signals.task_prerun.connect
def _arrived(task=None, args=None, kwargs=None, **_rest) -> None:
    if task is not None and task.name == TASK_NAME:
        order_id = (kwargs or {}).get("order_id", (args or [None])[0])
        _redis.hincrby(ARRIVALS_KEY, f"{TASK_NAME} {order_id}", 1)
