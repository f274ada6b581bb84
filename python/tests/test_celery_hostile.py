"""The shared table of hostile values (conformance/hostile.json, issue 29) through a real
`celery worker` (prefork pool, the `worker` fixture of test_celery): each value as the
operation key and as a payload sent twice by a producer, and as the body's result
(built in the pool child). For each: the pool child survives (no SIGSEGV in the log),
the body runs at most once, a refusal is the library's error naming the task (raised at
`delay` for a key, or as the task's failure), a result that cannot be stored leaves the
completion standing. A value Celery's own JSON serializer cannot send (nesting deeper
than Python's recursion limit, an int over int_max_str_digits, an object) never leaves
the producer: kombu raises there, and the case is not a message to lose."""

from __future__ import annotations

import pytest
from effects import _connect, effects
from hostile import CASES, NAMES, native, value
from kombu.exceptions import EncodeError
from test_celery import TIMEOUT, worker  # noqa: F401 - the module's worker fixture

import idempotent_job
from idempotent_job import errors
from idempotent_job.celery import DEFERRALS_HEADER, UNREACHABLE_HEADER, IdempotentTask

UNSENDABLE = (EncodeError, ValueError, TypeError, RecursionError)
# The cases kombu's JSON cannot write (Python's recursion limit, int_max_str_digits, an
# object); every other case reaches the worker.
CANNOT_SEND = {
    "a list nested 10,000 deep",
    "a list nested 100,000 deep",
    "an integer of 5,000 digits",
    "an object JSON cannot carry",
}


def _deliver_twice(worker, case, scenario, use, args):  # noqa: F811 - the fixture
    """Sends `args` twice; returns the library errors seen (at `delay` or as the task's
    failure), or None when the producer could not send the value at all."""
    refusals = []
    for _ in range(2):
        try:
            result = worker.hostile.delay(scenario, *args)
        except errors.IdempotentJobError as e:
            refusals.append(e)
            continue
        except UNSENDABLE:
            return None
        try:
            result.get(timeout=TIMEOUT)
        except errors.IdempotentJobError as e:
            refusals.append(e)
    for e in refusals if case[use] == "refused" else []:
        assert worker.hostile.name in str(e), str(e)
        assert case["problem"].lower() in str(e).lower(), f"{case['name']} as {use}: {e}"
    return refusals


def _forget_key(job_type: str, key) -> None:
    """Deletes the record an earlier run left for `key` (a value as a key is the same
    operation in every run), so its first delivery here runs."""
    from idempotent_job._native import Store

    try:
        text = Store.operation_key(job_type, key, False)
    except errors.IdempotentJobError:
        return  # a key the library refuses has no record
    with _connect() as conn:
        conn.execute(
            "DELETE FROM idempotent_job_records WHERE job_type = %s AND operation_key = %s", (job_type, text)
        )


def _as_it_arrives(job_type: str, hostile, use: str, scenario: str):
    """The library's verdict on `hostile` as a Celery worker receives it: kombu's JSON
    changes some values in transit (an int, float, None or bool map key arrives as a
    string; two keys that write the same text arrive as one; a set or a tuple key is not
    sent at all). None: the producer cannot send it; else "refused" or "runs", asked of
    the plain API in this process with the value that arrives (a key the door refuses at
    `delay` is refused before it is sent)."""
    from kombu.utils.json import dumps, loads

    if use == "key" and _refused("CeleryArrivalProbe", hostile, None):
        return "refused"  # the door checks a key at `delay`, before it is sent
    try:
        arrived = loads(dumps(hostile))
    except UNSENDABLE:
        return None
    if use == "key":
        _forget_key(job_type, arrived)  # the operation the worker will see, left by an earlier run
    if use == "key":
        return "refused" if _refused("CeleryArrivalProbe", arrived, None) else "runs"
    return "refused" if _refused("CeleryArrivalProbe", f"{scenario}-arrival", arrived) else "runs"


def _refused(job_type: str, key, payload) -> bool:
    """Whether the plain API refuses this key or payload (the library's error)."""
    try:
        idempotent_job.perform_once(job_type, key, lambda claim: None, payload=payload)
    except errors.IdempotentJobError:
        return True
    return False


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_hostile_values_through_a_celery_worker(worker, scenario, case):  # noqa: F811 - the fixture
    if not native(case):
        pytest.skip("a Ruby value (a binary String, a Symbol): Python has none")
    # The cases of sets, bytes, map keys and surrogates (the table's cases with facts)
    # are judged as they arrive: kombu's JSON changes some in transit.
    in_transit = "facts" in case
    hostile = value(case)
    _forget_key(worker.hostile.name, hostile)
    for use, args in (("key", (hostile, None, None)), ("payload", (f"p-{scenario}", hostile, None))):
        expected = _as_it_arrives(worker.hostile.name, hostile, use, scenario) if in_transit else case[use]
        refusals = _deliver_twice(worker, dict(case, **{use: expected}), f"{scenario}-{use}", use, args)
        if refusals is None:
            # Celery's serializer refused it in the producer: nothing was sent.
            sendable = expected is not None if in_transit else case["name"] not in CANNOT_SEND
            assert not sendable, f"{case['name']} as {use}: not sent"
            continue
        assert expected is not None, f"{case['name']} as {use}: sent, though kombu cannot write it"
        runs = effects(f"{scenario}-{use}")
        if expected == "refused":
            assert len(refusals) == 2 and runs == 0, f"{case['name']} as {use}: {refusals}"
        else:
            assert refusals == [] and runs == 1, f"{case['name']} as {use}: {refusals}, {runs} runs"

    # As the body's result, built in the pool child.
    for _ in range(2):
        worker.hostile.delay(f"{scenario}-result", f"r-{scenario}", None, case["name"]).get(
            timeout=TIMEOUT, propagate=False
        )
    record = idempotent_job.record(worker.hostile.name, f"r-{scenario}")
    assert record["status"] == "completed" and effects(f"{scenario}-result") == 1
    assert (record["result_state"] == "stored") == (case["result"] == "stored"), record["result_state"]
    log = worker.worker_log.read_text() if worker.worker_log.exists() else ""
    assert "signal 11" not in log and "SIGSEGV" not in log


COUNT_VALUES = ["abc", "1.5", 1.5, 10**30, -1, True, [], ""]


@pytest.mark.parametrize("header", [DEFERRALS_HEADER, UNREACHABLE_HEADER])
@pytest.mark.parametrize(
    "count", COUNT_VALUES, ids=["text", "float-text", "float", "10**30", "-1", "True", "list", "empty"]
)
def test_a_count_header_that_is_not_a_count_fails_the_task_naming_the_task_and_header(
    worker,  # noqa: F811 - the fixture
    scenario,
    header,
    count,
):
    # The door's own headers, as another producer (or a hand-made message) may write
    # them. Before: int(value) raised a bare ValueError ("abc", "1.5"), 1.5 and True were
    # taken as 1, -1 and 10**30 raised pyo3's OverflowError, each naming neither the task
    # nor the header. Now Celery's failure convention (the result backend keeps the
    # failure and the message's arguments: the delivery is visible, not silently lost),
    # raised before anything is claimed.
    order = f"{scenario}-A"
    result = worker.charge.apply_async((scenario, order), headers={header: count})
    with pytest.raises(errors.ConfigurationError) as raised:
        result.get(timeout=TIMEOUT)
    assert str(raised.value) == (
        f"{worker.charge.name}: the message header {header} must be a whole number from 0 to "
        f"4294967295, got {count!r}; the job was not run and nothing was recorded"
    )
    assert result.state == "FAILURE"
    assert effects(scenario) == 0
    assert idempotent_job.record(worker.charge.name, order) is None
    # A count the rule takes (an int, or its decimal text) runs the task once.
    again = worker.charge.apply_async((scenario, order), headers={header: "2"})
    assert again.get(timeout=TIMEOUT)["charged"] == order
    assert effects(scenario) == 1


def test_a_key_on_a_positional_only_parameter_reads_the_argument_not_a_keyword_of_its_name(
    worker,  # noqa: F811 - the fixture
    scenario,
):
    # Before: the part's parameter name was looked up in the keyword arguments first, so
    # a keyword argument order_id (another value, in **options) was read as the key:
    # each call with another keyword ran the body again.
    task = worker.positional_only
    order = f"{scenario}-A"
    first = task.apply_async((scenario, order), {"order_id": f"{scenario}-B"})
    assert first.get(timeout=TIMEOUT) == {"order_id": order, "options": {"order_id": f"{scenario}-B"}}
    second = task.apply_async((scenario, order), {"order_id": f"{scenario}-C"})
    assert second.get(timeout=TIMEOUT)["order_id"] == order
    assert effects(scenario) == 1
    assert idempotent_job.record(task.name, order)["status"] == "completed"
    assert idempotent_job.record(task.name, f"{scenario}-B") is None


@pytest.mark.parametrize(
    "key,shown",
    [
        ("args", "*args"),
        ("kwargs", "**kwargs"),
        ("kwargs.order_id", "**kwargs"),
        (["order_id", "args"], "*args"),
    ],
)
def test_a_key_naming_the_variable_arguments_is_refused_at_declaration(
    worker,  # noqa: F811 - the fixture
    key,
    shown,
):
    # Before: taken at declaration, and never resolved: every delivery failed with "the
    # argument is missing" (the task could never run).
    name = f"star_key_task_{len(shown)}_{len(str(key))}"
    with pytest.raises(errors.OperationKeyError) as raised:

        @worker.app.task(base=IdempotentTask, name=name, idempotency_key=key)
        def star_task(order_id, *args, **kwargs):
            return order_id

        star_task.name  # noqa: B018 - evaluates a lazy task
    assert str(raised.value).startswith(
        f"{name}: idempotency_key {key!r} names {shown}, the variable arguments"
    )
