"""The Celery app the replay tests run in a real `celery worker` (prefork pool; Redis
broker and result backend on the suite's Redis, database 5). idempotent_job is
configured, and its pool used, here in the worker's parent process; each pool child
builds its own pool after the fork."""

from __future__ import annotations

import os
import signal
import time

from celery import Celery
from effects import record_effect, record_start

import idempotent_job
from idempotent_job.celery import IdempotentTask

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
BROKER_URL = REDIS_URL.rsplit("/", 1)[0] + "/5"
# The killable tasks' lease: short, so a killed claim goes stale soon.
LEASE = 2
# The lease of the scenarios about a live run (charge: three times, five copies at once):
# a database stalled by a loaded machine for longer than a 2 s lease lets a copy take a
# live run over (a second effect, and LostClaimError for the first run's completion).
LIVE_LEASE = 60

app = Celery("idempotent_job_tests", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    task_acks_late=True,  # a message is acknowledged after the task, so a lost worker's is redelivered
    task_reject_on_worker_lost=True,  # ... at once, when the pool child dies (SIGKILL)
    worker_prefetch_multiplier=1,
    broker_transport_options={"visibility_timeout": 3600},  # far longer than any lease here
    result_expires=600,
    worker_hijack_root_logger=False,
)

# The queue of the worker with a short deadline (test_a_claim_failing_..., its own worker).
CLAIM_RETRY_QUEUE = "claim_retry"
# That worker's deadline and connect_timeout, seconds: a stalled PostgreSQL fails its claim soon.
SHORT_DEADLINE = os.environ.get("IDEMPOTENT_JOB_TEST_SHORT_DEADLINE")
if SHORT_DEADLINE:
    limits = {"deadline": float(SHORT_DEADLINE), "connect_timeout": float(SHORT_DEADLINE)}
else:
    # A deadline beyond any wait here: only an interrupt ends a blocked statement early.
    limits = {"deadline": 120}
# The queue of the workers started with a wrong database URL (test_a_misconfigured_...).
MISCONFIGURED_QUEUE = "misconfigured"
# A worker's own database URL (a wrong role, a database without the table): its claims fail.
WORKER_URL = os.environ.get("IDEMPOTENT_JOB_TEST_WORKER_URL")
idempotent_job.configure(database_url=WORKER_URL or os.environ["DATABASE_URL"], lease=LEASE, **limits)
if not WORKER_URL:
    idempotent_job.migrate()  # the parent uses its pool before forking the pool children


def _charge(scenario: str, order_id: str, hold: float) -> dict:
    record_effect(scenario, order_id)
    time.sleep(hold)
    return {"charged": order_id, "pid": os.getpid()}


@app.task(base=IdempotentTask, idempotency_key="order_id", idempotency_lease=LIVE_LEASE)
def charge(scenario, order_id, hold=0.0):
    return _charge(scenario, order_id, hold)


@app.task(base=IdempotentTask, idempotency_key="order_id", acks_late=False)
def charge_early_ack(scenario, order_id, hold=0.0):
    return _charge(scenario, order_id, hold)


@app.task(base=IdempotentTask, idempotency_key="order_id", reject_on_worker_lost=False)
def charge_unrejected(scenario, order_id, hold=0.0):
    return _charge(scenario, order_id, hold)


@app.task
def charge_unguarded(scenario, order_id, hold=0.0):
    return _charge(scenario, order_id, hold)


@app.task(
    base=IdempotentTask,
    idempotency_key="order_id",
    idempotency_lease=LIVE_LEASE,
    idempotency_store_result=False,
)
def charge_unstored(scenario, order_id, hold=0.0):
    return _charge(scenario, order_id, hold)


@app.task
def after(value, scenario):
    """A chain's next step: what the step before it returned (a replayed repeat: the first run's value)."""
    record_effect(scenario, "after")
    return {"after": value}


@app.task
def collect(values, scenario):
    """A chord's body: the header's results, in order."""
    return {"collected": values}


def _killable(scenario: str, order_id: str, effect_first: bool) -> str:
    starts = record_start(scenario, order_id)
    if effect_first:
        record_effect(scenario, order_id)
    if starts == 1:
        time.sleep(120)  # the test SIGKILLs this pool child here
    if not effect_first:
        record_effect(scenario, order_id)
    return "done"


@app.task(base=IdempotentTask, idempotency_key=1, idempotency_lease=LEASE, idempotency_on_stale="reclaim")
def killable_reclaim(scenario, order_id, effect_first):
    return _killable(scenario, order_id, effect_first)


@app.task(base=IdempotentTask, idempotency_key=1, idempotency_lease=LEASE, idempotency_on_stale="hold")
def killable_hold(scenario, order_id, effect_first):
    return _killable(scenario, order_id, effect_first)


@app.task(
    base=IdempotentTask, idempotency_key="order_id", idempotency_lease=LEASE, idempotency_on_stale="hold"
)
def killable_hold_kw(scenario, order_id, effect_first):
    # Called with keyword arguments: a rerun must send them as keywords again.
    return _killable(scenario, order_id, effect_first)


@app.task
def killable_unguarded(scenario, order_id, effect_first):
    return _killable(scenario, order_id, effect_first)


def _poison(scenario: str, order_id: str) -> str:
    """A body that kills its own pool child (out of memory, a segfault in a C library) on
    its first two runs, and returns on a third."""
    if record_start(scenario, order_id) <= 2:
        os.kill(os.getpid(), signal.SIGKILL)
    record_effect(scenario, order_id)
    return "done"


@app.task(
    base=IdempotentTask,
    idempotency_key=1,
    idempotency_lease=LEASE,
    idempotency_on_stale="reclaim",
    idempotency_max_takeovers=1,
)
def poison_budgeted(scenario, order_id):
    return _poison(scenario, order_id)


@app.task(base=IdempotentTask, idempotency_key=1, idempotency_lease=LEASE, idempotency_on_stale="reclaim")
def poison_unbudgeted(scenario, order_id):
    return _poison(scenario, order_id)


@app.task(
    bind=True,
    base=IdempotentTask,
    idempotency_key="payload.order.id",
    idempotency_scope="ChargeOrder",
    autoretry_for=(RuntimeError,),
    retry_kwargs={"countdown": 0.2},
    max_retries=2,
)
def flaky(self, scenario, payload):
    record_start(scenario, str(payload["order"]["id"]))
    if self.request.retries < 2:
        raise RuntimeError("flaky gateway")
    record_effect(scenario, str(payload["order"]["id"]))
    return {"retries": self.request.retries}


@app.task(base=IdempotentTask, idempotency_key=1, soft_time_limit=1)
def limited(scenario, order_id):
    record_effect(scenario, order_id)
    return "ran"


@app.task(base=IdempotentTask, idempotency_key=1, idempotency_lease=LIVE_LEASE)
def charge_when_reachable(scenario, order_id):
    record_effect(scenario, order_id)
    return {"charged": order_id}


def _nested(levels: int):
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@app.task(
    base=IdempotentTask,
    idempotency_key="order_id",
    idempotency_lease=LIVE_LEASE,
    idempotency_store_result=True,
)
def nested_result(scenario, order_id, levels):
    """Returns a list nested `levels` deep (issue 29: 10,000 deep killed the pool child)."""
    record_effect(scenario, order_id)
    return _nested(levels)


@app.task(
    base=IdempotentTask,
    idempotency_key="order_id",
    idempotency_scope="CrossOrder",
    idempotency_lease=LIVE_LEASE,
)
def cross_order(scenario, order_id):
    """The Celery copy of an operation a Rust service and a Sidekiq job also deliver
    (job type CrossOrder, key order_id): its body must not run after the Rust one did."""
    record_effect(scenario, str(order_id))
    return f"celery ran {order_id}"


@app.task(
    base=IdempotentTask,
    idempotency_key=1,
    idempotency_lease=LIVE_LEASE,
    idempotency_store_result=True,
)
def hostile(scenario, key, payload, result_case):
    """Issue 29's hostile values (conformance/hostile.json): `key` is the operation key,
    `payload` rides along in the arguments, and the body returns the value of the table's
    case named `result_case` (built here, in the pool child), or "done"."""
    import hostile as table

    record_effect(scenario, "hostile")
    return "done" if result_case is None else table.value(table.BY_NAME[result_case])


# typing=False: Celery's own argument check rebuilds the signature without its "/" and
# would refuse a keyword argument named as a positional-only parameter.
@app.task(base=IdempotentTask, idempotency_key="order_id", idempotency_lease=LIVE_LEASE, typing=False)
def positional_only(scenario, order_id, /, **options):
    """A key on a positional-only parameter: a keyword argument of its name is another
    value (it lands in ``options``), never the key."""
    record_effect(scenario, order_id)
    return {"order_id": order_id, "options": options}
