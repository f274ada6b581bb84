"""The replay scenarios through a real `celery worker` (prefork pool, Redis broker and
result backend): the same message three times, five copies at once, a pool child
SIGKILLed after its claim or after its effect, two distinct operations; each also
without the door, where it must show the duplicate effect. And the door's declaration
errors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import redis
from celery.exceptions import TimeoutError as CeleryTimeout
from conftest import eventually, postgresql_pids, signal_all
from effects import effects, first_start_pid, pids

import idempotent_job
from idempotent_job import errors

TESTS = Path(__file__).parent
TIMEOUT = 90


@pytest.fixture(scope="module")
def worker(request, tmp_path_factory):
    import celery_tasks

    redis.Redis.from_url(celery_tasks.BROKER_URL).flushdb()
    yield from _run_worker(request, tmp_path_factory, celery_tasks, "pytest", [], {}, "worker_log")


@pytest.fixture(scope="module")
def short_deadline_worker(request, tmp_path_factory, worker):
    """A second worker, consuming only CLAIM_RETRY_QUEUE, with a 2 s deadline and
    connect_timeout: a stalled PostgreSQL fails its claims within seconds."""
    yield from _run_worker(
        request,
        tmp_path_factory,
        worker,
        "pytest-short",
        [f"--queues={worker.CLAIM_RETRY_QUEUE}"],
        {"IDEMPOTENT_JOB_TEST_SHORT_DEADLINE": "2"},
        "short_worker_log",
    )


def _run_worker(request, tmp_path_factory, celery_tasks, name, extra, extra_env, log_attr):
    """Runs a `celery worker` of celery_tasks (hostname `name-…`, `extra` arguments,
    `extra_env` over the environment) until the module's tests are done; yields
    celery_tasks with attribute `log_attr` set to its log file (printed when a test failed)."""
    with _celery_worker(request, tmp_path_factory, name, extra, extra_env) as log:
        setattr(celery_tasks, log_attr, log)
        yield celery_tasks


@contextlib.contextmanager
def _celery_worker(request, tmp_path_factory, name, extra, extra_env, concurrency=3):
    """A `celery worker` of celery_tasks (prefork, `concurrency` children) while the
    block runs, stopped by SIGTERM (a warm shutdown: messages it reserved go back to the
    broker); yields its log file (printed when a test failed)."""
    import celery_tasks

    log = tmp_path_factory.mktemp("celery") / "worker.log"
    hostname = f"{name}-{uuid.uuid4().hex[:8]}@localhost"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    env.update(extra_env)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_tasks",
            "worker",
            "--pool=prefork",
            f"--concurrency={concurrency}",
            "--loglevel=INFO",
            f"--hostname={hostname}",
            "--without-gossip",
            "--without-mingle",
            f"--logfile={log}",
            *extra,
        ],
        cwd=TESTS,
        env=env,
    )
    failed_before = request.session.testsfailed
    try:
        eventually(
            lambda: celery_tasks.app.control.ping(destination=[hostname], timeout=0.5),
            "the Celery worker to answer",
            60,
            0.5,
        )
        yield log
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if os.environ.get("IDEMPOTENT_JOB_SHOW_WORKER_LOG") or request.session.testsfailed > failed_before:
            print(f"--- the Celery worker's log ({log}) ---\n{log.read_text()}")


def _explain(worker, task: str, scenario: str, *results) -> str:
    """What a failing wait left: the record, the pids that started a body and did an
    effect, and the worker log's lines about these task ids or a lost pool child."""
    record = idempotent_job.record(getattr(worker, task).name, scenario)
    ids = {r.id for r in results}
    log = worker.worker_log.read_text().splitlines() if worker.worker_log.exists() else []
    lines = [
        line
        for line in log
        if any(i in line for i in ids) or "exited with" in line or "raised unexpected" in line
    ]
    return "\n".join([f"record: {record}", f"pids: {pids(scenario)}", "worker log:", *lines[-80:]])


def _get(worker, task: str, scenario: str, result):
    """`result.get()` within TIMEOUT; on a timeout, fails with `_explain`."""
    try:
        return result.get(timeout=TIMEOUT)
    except CeleryTimeout:
        pytest.fail(f"no result for {result.id} in {TIMEOUT} s\n{_explain(worker, task, scenario, result)}")


@pytest.mark.parametrize("task,expected", [("charge", 1), ("charge_unguarded", 3)])
def test_the_same_message_three_times(worker, scenario, task, expected):
    task_id = str(uuid.uuid4())
    values = []
    for _ in range(3):
        result = getattr(worker, task).apply_async((scenario, scenario), task_id=task_id)
        values.append(result.get(timeout=TIMEOUT))
        result.forget()  # so the next .get() waits for the next delivery's result
    assert effects(scenario) == expected
    assert values[0]["charged"] == scenario


def test_a_repeat_returns_the_first_runs_stored_result(worker, scenario):
    # Three separate .delay() calls of one operation: the body runs once; each repeat's
    # AsyncResult.get() is the first run's stored value (its pid included), replayed.
    values = [worker.charge.delay(scenario, scenario).get(timeout=TIMEOUT) for _ in range(3)]
    assert effects(scenario) == 1
    assert values[1] == values[0] and values[2] == values[0]
    assert idempotent_job.record(worker.charge.name, scenario)["result_state"] == "stored"


@pytest.mark.parametrize("task,expected", [("charge", 1), ("charge_unguarded", 5)])
def test_five_copies_at_once(worker, scenario, task, expected):
    results = [getattr(worker, task).apply_async((scenario, scenario, 1.0)) for _ in range(5)]
    values = [_get(worker, task, scenario, r) for r in results]
    assert all(r.successful() for r in results)
    assert effects(scenario) == expected, _explain(worker, task, scenario, *results)
    assert sum(1 for v in values if v is not None) >= 1


def _repeat_facts(job_type: str, key: str) -> list[dict]:
    """The record's `repeat_facts` (one entry per repeated delivery, the last 20)."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
        row = c.execute(
            "SELECT repeat_facts FROM idempotent_job_records WHERE job_type = %s AND operation_key = %s",
            (job_type, key),
        ).fetchone()
    return row[0] if row else []


def test_four_copies_count_four_duplicates_however_often_they_come_back(worker, scenario):
    # Issue 34: five copies at once of a body that holds its claim 2.5 s: one runs, the
    # four others meet the live claim and come back (the door's deferrals, Celery
    # retries with a countdown of 1 s, then 2 s…) until they replay the completion.
    # `duplicates` counts the four copies once each, not each return (before: 4 + every
    # return, e.g. 20).
    job_type = worker.charge.name
    results = [worker.charge.apply_async((scenario, scenario, 2.5)) for _ in range(5)]
    values = [_get(worker, "charge", scenario, r) for r in results]
    assert effects(scenario) == 1 and all(v == values[0] for v in values)

    def settled():  # every copy's last delivery (a replay) written by its pool child
        facts = _repeat_facts(job_type, scenario)
        return facts if sum(f["decision"] == "completed" for f in facts) == 4 else None

    facts = eventually(
        settled,
        "each copy's replay in the repeats",
        explain=lambda: _explain(worker, "charge", scenario, *results),
    )
    returns = [f for f in facts if (f.get("facts") or {}).get("deferrals")]
    assert returns, f"no copy came back, so this shows nothing: {facts}"
    record = idempotent_job.record(job_type, scenario)
    assert record["duplicates"] == 4, (record, facts)
    assert record["mismatches"] == 0


def _kill_the_child(scenario: str, after_effect: bool = False) -> None:
    pid = eventually(lambda: first_start_pid(scenario, scenario), "the task's body to start")
    if after_effect:  # killed after its effect, not between its start and its effect
        eventually(lambda: effects(scenario) >= 1, "the task's effect")
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("task", ["killable_reclaim", "killable_unguarded"])
def test_pool_child_sigkilled_after_the_claim(worker, scenario, task):
    # Redelivered at once (acks_late, task_reject_on_worker_lost); with the door the copy
    # meets the live claim, comes back after retry_after, takes the stale claim over once
    # its lease ends and runs: one effect.
    result = getattr(worker, task).apply_async((scenario, scenario, False))
    _kill_the_child(scenario)
    assert result.get(timeout=TIMEOUT) == "done"
    assert effects(scenario) == 1


@pytest.mark.parametrize("task,expected", [("killable_hold", 1), ("killable_unguarded", 2)])
def test_pool_child_sigkilled_after_the_effect(worker, scenario, task, expected):
    result = getattr(worker, task).apply_async((scenario, scenario, True))
    _kill_the_child(scenario, after_effect=True)
    if task == "killable_hold":
        eventually(
            lambda: (
                (idempotent_job.record(worker.killable_hold.name, scenario) or {}).get("status") == "held"
            ),
            "the stale claim to be held",
            TIMEOUT,
            explain=lambda: _explain(worker, task, scenario, result),
        )
    else:
        assert result.get(timeout=TIMEOUT) == "done"
    assert effects(scenario) == expected


@pytest.mark.parametrize("task,budget", [("poison_budgeted", True), ("poison_unbudgeted", False)])
def test_a_body_that_kills_its_pool_child_is_held_after_max_takeovers(worker, scenario, task, budget):
    # Issue 34: a body that SIGKILLs its own pool child on each of its first two runs.
    # Redelivered at once (acks_late, task_reject_on_worker_lost), each copy comes back
    # until the killed claim's lease ends and takes it over. With
    # idempotency_max_takeovers=1 the first run and one takeover run; the second stale
    # claim is held for a person, saying why. Control without the budget: reclaimed
    # again, the third run returns.
    result = getattr(worker, task).apply_async((scenario, scenario))
    job_type = getattr(worker, task).name
    if not budget:
        assert _get(worker, task, scenario, result) == "done"
        assert (len(pids(scenario)["starts"]), effects(scenario)) == (3, 1)
        return
    held = eventually(
        lambda: (r := idempotent_job.record(job_type, scenario)) and r["status"] == "held" and r,
        "the poison operation to be held",
        TIMEOUT,
        explain=lambda: _explain(worker, task, scenario, result),
    )
    assert held["last_error"] == (
        "the reclaim budget is spent: 2 stale takeovers of this operation, max_takeovers 1"
    )
    assert (held["attempts"], held["takeovers"]) == (3, 2)
    assert (len(pids(scenario)["starts"]), effects(scenario)) == (2, 0)


@pytest.mark.parametrize("task,kw", [("killable_hold", False), ("killable_hold_kw", True)])
def test_a_held_operation_resolved_for_a_rerun_is_sent_again_and_runs_once(worker, scenario, task, kw):
    # Held after its pool child died past the effect; resolve(as_="rerun") sends the task
    # again by name (with its keyword arguments as keywords) and a worker runs it once
    # more, as a retry. Control: without the door's sender the record stays released
    # and nothing runs (the defect issue 34 reports).
    task_ = getattr(worker, task)
    args = (
        ((), {"scenario": scenario, "order_id": scenario, "effect_first": True})
        if kw
        else (
            (scenario, scenario, True),
            {},
        )
    )
    task_.apply_async(*args)
    _kill_the_child(scenario, after_effect=True)
    eventually(
        lambda: (idempotent_job.record(task_.name, scenario) or {}).get("status") == "held",
        "the stale claim to be held",
        TIMEOUT,
    )
    assert idempotent_job.resolve(task_.name, scenario, as_="rerun") is True
    eventually(
        lambda: (idempotent_job.record(task_.name, scenario) or {}).get("status") == "completed",
        "the rerun to complete",
        TIMEOUT,
    )
    record = idempotent_job.record(task_.name, scenario)
    assert (record["resolution"], record["last_claim"], record["takeovers"]) == ("rerun", "retry", 1)
    assert effects(scenario) == 2  # the first run's (before the kill) and the rerun's


def test_a_rerun_no_sender_takes_is_released_and_says_so(worker, scenario, caplog):
    from idempotent_job import celery as door

    task_ = worker.killable_hold
    task_.apply_async((scenario, scenario, True))
    _kill_the_child(scenario, after_effect=True)
    eventually(
        lambda: (idempotent_job.record(task_.name, scenario) or {}).get("status") == "held",
        "the stale claim to be held",
        TIMEOUT,
    )
    idempotent_job._senders.remove(door.send_rerun)
    try:
        with caplog.at_level("WARNING", logger="idempotent_job"):
            assert idempotent_job.resolve(task_.name, scenario, as_="rerun") is True
    finally:
        idempotent_job.on_rerun(door.send_rerun)
    assert "released only; no sender registered" in caplog.text
    assert idempotent_job.record(task_.name, scenario)["status"] == "released"
    assert effects(scenario) == 1


def test_a_replayed_repeat_continues_its_chain_and_link_with_the_first_runs_value(worker, scenario):
    # Issue 34: a repeat answered from the stored result must not break its chain: the next
    # step gets the first run's value (its pid shows it is a replay, not a second run).
    from celery import chain

    first = chain(worker.charge.s(scenario, scenario), worker.after.s(scenario)).apply_async()
    value = first.get(timeout=TIMEOUT)["after"]
    assert value["charged"] == scenario
    again = chain(worker.charge.s(scenario, scenario), worker.after.s(scenario)).apply_async()
    assert again.get(timeout=TIMEOUT) == {"after": value}
    linked = worker.charge.apply_async((scenario, scenario), link=worker.after.s(scenario))
    assert linked.get(timeout=TIMEOUT) == value
    eventually(lambda: effects(scenario, "after") == 3, "the linked step to run")
    assert effects(scenario, scenario) == 1


def test_a_deferred_copy_comes_back_and_continues_its_chain_with_the_value(worker, scenario):
    # Two chains at once: one copy runs (2 s), the other meets the live claim, is sent
    # back (signature_from_request keeps its chain) and replays the value when it returns.
    from celery import chain

    chains = [
        chain(worker.charge.s(scenario, scenario, 2.0), worker.after.s(scenario)).apply_async()
        for _ in range(2)
    ]
    results = [c.get(timeout=TIMEOUT) for c in chains]
    assert results[0] == results[1] and results[0]["after"]["charged"] == scenario
    assert effects(scenario, scenario) == 1 and effects(scenario, "after") == 2


def test_a_chord_of_copies_gets_the_value_from_each(worker, scenario):
    from celery import chord

    header = [worker.charge.s(scenario, scenario, 1.0) for _ in range(3)]
    result = chord(header)(worker.collect.s(scenario)).get(timeout=TIMEOUT)
    values = result["collected"]
    assert len(values) == 3 and all(v == values[0] for v in values) and values[0]["charged"] == scenario
    assert effects(scenario, scenario) == 1


def test_a_repeat_with_no_stored_result_continues_the_chain_with_none(worker, scenario):
    # idempotency_store_result=False: the repeat completes with None, which is what the
    # chain's next step receives (documented); the control with a stored result is above.
    from celery import chain

    first = chain(worker.charge_unstored.s(scenario, scenario), worker.after.s(scenario)).apply_async()
    assert first.get(timeout=TIMEOUT)["after"]["charged"] == scenario
    again = chain(worker.charge_unstored.s(scenario, scenario), worker.after.s(scenario)).apply_async()
    assert again.get(timeout=TIMEOUT) == {"after": None}
    assert effects(scenario, scenario) == 1


@pytest.mark.parametrize("task", ["charge", "charge_unguarded"])
def test_two_distinct_operations_both_run(worker, scenario, task):
    results = [getattr(worker, task).apply_async((scenario, f"{scenario}-{n}")) for n in (1, 2)]
    assert [r.get(timeout=TIMEOUT)["charged"] for r in results] == [f"{scenario}-1", f"{scenario}-2"]
    assert effects(scenario, f"{scenario}-1") == 1 and effects(scenario, f"{scenario}-2") == 1


def _runs_twice_and_warns_once(worker, scenario, task, warning):
    """Sends ``task`` two distinct operations, checks both ran, and that the worker's log
    has ``warning`` for the task once per pool child (at least once, never twice from one
    child). Returns the log."""
    results = [getattr(worker, task).apply_async((scenario, f"{scenario}-{n}")) for n in (1, 2)]
    assert [r.get(timeout=TIMEOUT)["charged"] for r in results] == [f"{scenario}-1", f"{scenario}-2"]
    log = worker.worker_log.read_text()
    warning = f"celery_tasks.{task}: {warning}"
    warned_by = [line.split("]")[0].rsplit("/", 1)[-1] for line in log.splitlines() if warning in line]
    assert warned_by and len(warned_by) == len(set(warned_by)), log[-3000:]
    return log


def test_a_task_acknowledged_early_runs_and_the_worker_warns_once(worker, scenario):
    # acks_late=False (Celery's default): a killed worker would lose the message and leave
    # its claim waiting for a redelivery that never comes. The task runs; the log says so.
    log = _runs_twice_and_warns_once(
        worker,
        scenario,
        "charge_early_ack",
        "acks_late is off, so a worker killed mid-task loses its message",
    )
    assert "set acks_late=True (or task_acks_late) and task_reject_on_worker_lost=True" in log
    assert "celery_tasks.charge: acks_late is off" not in log


def test_a_task_acknowledged_when_its_pool_child_dies_runs_and_the_worker_warns_once(worker, scenario):
    # acks_late on but reject_on_worker_lost off (Celery's default): a pool child killed
    # mid-task (SIGKILL, the OOM killer) gets its message acknowledged as failed, not
    # requeued, so the claim waits for a redelivery that never comes, as with acks_late off.
    log = _runs_twice_and_warns_once(
        worker, scenario, "charge_unrejected", "reject_on_worker_lost is off, so a pool child killed mid-task"
    )
    assert "set reject_on_worker_lost=True (or task_reject_on_worker_lost)" in log
    assert "celery_tasks.charge: reject_on_worker_lost is off" not in log


def test_autoretry_works_as_without_the_door(worker, scenario):
    # The body raises twice: each time the door releases the claim and Celery retries.
    payload = {"order": {"id": scenario}}
    result = worker.flaky.apply_async((scenario, payload))
    assert result.get(timeout=TIMEOUT) == {"retries": 2}
    assert effects(scenario) == 1
    record = idempotent_job.record("ChargeOrder", scenario)
    assert record["status"] == "completed" and record["attempts"] == 3


def test_a_bad_key_raises_at_delay_naming_the_task(worker):
    with pytest.raises(errors.OperationKeyError, match="charge"):
        worker.charge.delay("x", None)


def test_a_missing_key_argument_at_delay_says_what_the_task_got(worker):
    # A fresh-user trial: `(the task got 1 positional and [])` read as a Python list
    # leaked into the message; the words now say what arrived and what to pass.
    with pytest.raises(errors.OperationKeyError) as raised:
        worker.charge.delay("x")
    message = str(raised.value)
    assert "[]" not in message
    assert "the task got 1 positional argument and no keyword arguments" in message
    with pytest.raises(errors.OperationKeyError, match="1 positional argument and keyword arguments hold"):
        worker.charge.delay("x", hold=1)


def test_an_unknown_option_raises_at_declaration_naming_the_task(worker):
    with pytest.raises(errors.ConfigurationError, match="typo_task.*idempotency_leas"):

        @worker.app.task(base=worker.IdempotentTask, name="typo_task", idempotency_key=0, idempotency_leas=5)
        def typo_task(order_id):
            return order_id

        typo_task.name  # noqa: B018 - evaluates a lazy task


def test_a_key_naming_a_missing_parameter_raises_at_declaration(worker):
    with pytest.raises(errors.OperationKeyError, match="bad_key_task.*order"):

        @worker.app.task(base=worker.IdempotentTask, name="bad_key_task", idempotency_key="order")
        def bad_key_task(order_id):
            return order_id

        bad_key_task.name  # noqa: B018


def test_a_bad_option_value_raises_at_declaration_naming_the_task(worker):
    with pytest.raises(errors.ConfigurationError, match="bad_stale_task.*on_stale"):

        @worker.app.task(
            base=worker.IdempotentTask, name="bad_stale_task", idempotency_key=0, idempotency_on_stale="never"
        )
        def bad_stale_task(order_id):
            return order_id

        bad_stale_task.name  # noqa: B018


def test_the_soft_time_limit_interrupts_a_blocked_claim(worker, scenario):
    # A released record whose row this test holds locked: the task's claim statement
    # waits on the lock in the pool child's main thread. Celery's soft time limit (1 s)
    # raises SoftTimeLimitExceeded from its signal handler; the blocked call gives up
    # and raises it. Without the interrupt the claim would wait for the lock (the
    # worker's deadline is 120 s) and the result would not be ready in time.
    def fails(claim):
        raise RuntimeError("first attempt")

    with pytest.raises(RuntimeError):
        idempotent_job.perform_once(worker.limited.name, scenario, fails)
    locker = psycopg.connect(os.environ["DATABASE_URL"])
    try:
        locker.execute(
            "SELECT 1 FROM idempotent_job_records WHERE job_type = %s AND operation_key = %s FOR UPDATE",
            (worker.limited.name, scenario),
        )
        result = worker.limited.apply_async((scenario, scenario))
        result.get(timeout=TIMEOUT, propagate=False)
        assert type(result.result).__name__ == "SoftTimeLimitExceeded", repr(result.result)
        # Raised by the interrupted claim, not on top of the deadline's TimeoutError.
        assert "TimeoutError" not in (result.traceback or ""), result.traceback
    finally:
        locker.rollback()
        locker.close()
    assert effects(scenario) == 0


def test_a_claim_failing_on_a_stalled_database_comes_back(short_deadline_worker, scenario):
    # PostgreSQL frozen (SIGSTOP) past the worker's 2 s deadline: the delivery's claim
    # raises TimeoutError (or ConnectionError) before the body starts. The door sends the
    # delivery back (Celery's state RETRY) instead of failing it, which would have Celery
    # acknowledge the message and drop the delivery; once PostgreSQL runs again the copy
    # claims, runs once and its result is the task's value.
    worker = short_deadline_worker
    stalled = postgresql_pids()
    signal_all(stalled, signal.SIGSTOP)
    try:
        result = worker.charge_when_reachable.apply_async(
            (scenario, scenario), queue=worker.CLAIM_RETRY_QUEUE
        )
        eventually(lambda: result.state in ("RETRY", "FAILURE"), "the claim to fail", TIMEOUT)
    finally:
        signal_all(stalled, signal.SIGCONT)
    assert result.get(timeout=TIMEOUT) == {"charged": scenario}, result.traceback
    assert effects(scenario) == 1
    log = worker.short_worker_log.read_text()
    assert f"operation {scenario!r} of {worker.charge_when_reachable.name} could not be claimed" in log


@pytest.mark.parametrize("fault", ["wrong_role", "missing_table"])
def test_a_misconfigured_worker_sends_every_delivery_back(worker, request, tmp_path_factory, scenario, fault):
    # A worker whose database URL names a role that does not exist, or a database where
    # migrate() was never run: every claim fails before the body (28000 / 42P01). The door
    # sends each delivery back (Celery's RETRY) instead of failing it, which would have
    # Celery acknowledge the message and lose it; one error line names the cause. The
    # worker is stopped and one with the right URL started: every delivery runs once.
    base = os.environ["DATABASE_URL"]
    prefix, database = base.rsplit("/", 1)
    if fault == "wrong_role":
        url = base.replace("://postgres@", "://noloss_nobody@", 1)
        assert url != base
        cause = "role"
    else:
        database = f"empty_{scenario}"
        with psycopg.connect(base, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{database}"')
        url = f"{prefix}/{database}"
        cause = "idempotent_job_records does not exist"
    task = worker.charge_when_reachable
    queue = ["--queues=" + worker.MISCONFIGURED_QUEUE]
    orders = [f"{scenario}-{i}" for i in range(5)]
    try:
        wrong = {"IDEMPOTENT_JOB_TEST_WORKER_URL": url}
        with _celery_worker(request, tmp_path_factory, "pytest-misconfigured", queue, wrong, 1) as log:
            results = [task.apply_async((scenario, o), queue=worker.MISCONFIGURED_QUEUE) for o in orders]
            for result in results:
                eventually(lambda r=result: r.state in ("RETRY", "FAILURE"), "the claim to fail", TIMEOUT)
            assert [r.state for r in results] == ["RETRY"] * 5, [r.result for r in results]
            eventually(lambda: log.read_text().count("could not be claimed") >= 1, "the error line", TIMEOUT)
            errors_logged = [line for line in log.read_text().splitlines() if "could not be claimed" in line]
        # One pool child: one error line for the cause in the interval, not one per message.
        assert len(errors_logged) == 1, errors_logged
        assert "ERROR" in errors_logged[0] and cause in errors_logged[0], errors_logged
        # The core's words name the task and the operation, whatever the cause.
        assert f"cannot claim {task.name} operation" in errors_logged[0], errors_logged
        assert effects(scenario) == 0
        with _celery_worker(request, tmp_path_factory, "pytest-fixed", queue, {}):
            for result in results:
                assert _get(worker, "charge_when_reachable", scenario, result)["charged"].startswith(scenario)
        assert [effects(scenario, order) for order in orders] == [1] * 5
    finally:
        if fault == "missing_table":
            with psycopg.connect(base, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_options_sent_in_the_message_are_refused_naming_them(worker, scenario):
    # A producer that sends the task by name with an idempotency_* option (send_task,
    # another language's producer): the worker refuses it before anything is claimed,
    # naming the option and the nearest known one, instead of running the default policy.
    typo = worker.app.send_task(worker.charge.name, (scenario, scenario), idempotency_on_stail="hold")
    with pytest.raises(errors.ConfigurationError, match="idempotency_on_stail.*idempotency_on_stale"):
        typo.get(timeout=TIMEOUT)
    known = worker.app.send_task(worker.charge.name, (scenario, scenario), headers={"idempotency_lease": 5})
    with pytest.raises(errors.ConfigurationError, match="idempotency_lease .*is a task option"):
        known.get(timeout=TIMEOUT)
    assert effects(scenario) == 0
    assert idempotent_job.record(worker.charge.name, scenario) is None


def test_a_result_nested_10000_deep_completes_once_and_the_child_lives(worker, scenario):
    # Before issue 29's fix the pool child died with SIGSEGV converting the result after
    # the body ran: the record stayed claimed and the body ran again at every lease end.
    first = worker.nested_result.delay(scenario, scenario, 10_000)
    first.get(timeout=TIMEOUT, propagate=False)  # Celery's own result encoding may refuse it
    second = worker.nested_result.delay(scenario, scenario, 10_000)
    second.get(timeout=TIMEOUT, propagate=False)
    record = idempotent_job.record(worker.nested_result.name, scenario)
    assert record["status"] == "completed" and record["result_state"] == "unencodable"
    assert effects(scenario) == 1
    # The module's SIGKILL tests leave their own "exited with 'signal 9'" lines in the
    # shared worker log: only a crash converting a value (SIGSEGV) is this test's.
    log = worker.worker_log.read_text() if worker.worker_log.exists() else ""
    assert "signal 11" not in log and "SIGSEGV" not in log


SIDEKIQ_COPY = """
require "json"
require "sidekiq"
require "sidekiq/testing"
require "idempotent_job"
require "idempotent_job/sidekiq"
IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"))
class CrossOrderJob
  include Sidekiq::Worker
  sidekiq_options idempotency_key: 0, idempotency_scope: "CrossOrder"
  def perform(order_id)
    puts "sidekiq ran #{order_id}"
  end
end
Sidekiq::Testing.server_middleware { |chain| chain.add IdempotentJob::Sidekiq::ServerMiddleware }
Sidekiq::Testing.inline! { CrossOrderJob.perform_async(Integer(ARGV[0])) }
IdempotentJob.settle_repeats if IdempotentJob.respond_to?(:settle_repeats)
puts "delivered"
"""


def test_a_rust_claim_then_a_celery_task_and_a_sidekiq_job_decide_once(worker, scenario):
    # Issue 33: one operation (job type CrossOrder, key the order id) claimed by a Rust
    # service, then delivered as a real Celery task (to the prefork worker) and as a
    # Sidekiq job (through Sidekiq's server middleware chain): the Rust body runs, the
    # Celery copy meets the live claim and is retried until it finds the operation
    # completed, the Sidekiq copy finds it completed: one attempt, no other body.
    from test_cross_language import RUBY_PAYLOAD, ruby_script, rust

    key = abs(hash(scenario)) % 10**12
    first = rust("CrossOrder", str(key), RUBY_PAYLOAD, seconds=3)
    eventually(lambda: idempotent_job.record("CrossOrder", key), "the Rust claim", 60, 0.05)
    celery_copy = worker.cross_order.delay(scenario, key)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and json.loads(out)["decision"] == "ran"
    celery_copy.get(timeout=TIMEOUT)
    out = ruby_script(SIDEKIQ_COPY, str(key))
    assert "sidekiq ran" not in out and "delivered" in out
    record = idempotent_job.record("CrossOrder", key)
    assert record["status"] == "completed" and record["attempts"] == 1
    # The Celery copy (once, however often it came back) and the Sidekiq one.
    assert record["duplicates"] == 2
    assert effects(scenario) == 0  # the Celery body never ran
