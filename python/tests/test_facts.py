"""Facts the Python package reads from the core instead of restating them: the job
options table (a misspelled option raises naming the task or call, the bad name and the
nearest known one, in the core's wording, as in Ruby), the retention default, and a
result that cannot be encoded (recorded as ``unencodable``, as the Ruby gem does)."""

from __future__ import annotations

import inspect
import logging
import os
from datetime import timedelta

import pytest
from celery import Celery

import idempotent_job
from idempotent_job import _native, errors
from idempotent_job.celery import IdempotentTask

# No worker: declarations and delay() raise before anything reaches the broker.
app = Celery("idempotent_job_facts", broker="memory://", backend="cache+memory://")


def test_a_misspelled_task_option_raises_at_declaration_with_the_suggestion():
    with pytest.raises(errors.ConfigurationError) as caught:

        @app.task(base=IdempotentTask, name="leese_task", idempotency_key=0, idempotency_leese=60)
        def leese_task(order_id):
            return order_id

        leese_task.name  # noqa: B018 - evaluates a lazy task
    message = str(caught.value)
    assert message.startswith(
        "leese_task: unknown option idempotency_leese (did you mean idempotency_lease?); known options: "
        "idempotency_key, idempotency_scope, idempotency_lease"
    ), message


def test_the_sqs_doors_unknown_option_lists_only_the_options_it_takes():
    # The SQS door refuses scope (job_type is the record's job type: "pass job_type
    # instead"), so its unknown-option message must not offer scope among the known ones.
    from idempotent_job.sqs import batch_handler

    with pytest.raises(errors.ConfigurationError) as caught:
        batch_handler(print, job_type="SqsFacts", key="body.order_id", leese=3)
    message = str(caught.value)
    assert message.startswith(
        "SqsFacts: unknown option leese (did you mean lease?); known options: key, lease, "
    ), message
    assert "scope" not in message, message
    with pytest.raises(errors.ConfigurationError, match="SqsFacts: batch_handler takes no scope option"):
        batch_handler(print, job_type="SqsFacts", key="body.order_id", scope="Other")


def test_an_option_the_python_binding_does_not_take_is_refused_by_name():
    with pytest.raises(errors.ConfigurationError, match="tx_task: idempotency_transaction is not taken"):

        @app.task(base=IdempotentTask, name="tx_task", idempotency_key=0, idempotency_transaction=True)
        def tx_task(order_id):
            return order_id

        tx_task.name  # noqa: B018


def test_a_bad_task_option_value_is_checked_by_the_core():
    with pytest.raises(errors.ConfigurationError) as caught:

        @app.task(base=IdempotentTask, name="hb_task", idempotency_key=0, idempotency_heartbeat="false")
        def hb_task(order_id):
            return order_id

        hb_task.name  # noqa: B018
    assert str(caught.value) == 'hb_task: idempotency_heartbeat must be true or false, got "false"'
    # A timedelta is its total_seconds(), as Ruby takes 10.minutes: timedelta(60) is 60 days,
    # and 20 years is over the rule's ten, named as Python writes it.
    with pytest.raises(errors.ConfigurationError) as caught:

        @app.task(base=IdempotentTask, name="td_task", idempotency_key=0, idempotency_lease=timedelta(7300))
        def td_task(order_id):
            return order_id

        td_task.name  # noqa: B018
    assert str(caught.value) == (
        "td_task: idempotency_lease must be a positive number of seconds up to 315360000 (ten years), "
        "got datetime.timedelta(days=7300)"
    )


def test_a_misspelled_option_at_delay_raises_naming_the_task():
    @app.task(base=IdempotentTask, name="delay_task", idempotency_key=0)
    def delay_task(order_id):
        return order_id

    with pytest.raises(errors.ConfigurationError) as caught:
        delay_task.apply_async((1,), idempotency_on_stael="hold")
    assert str(caught.value).startswith(
        "delay_task: unknown option idempotency_on_stael (did you mean idempotency_on_stale?)"
    ), caught.value
    with pytest.raises(errors.ConfigurationError, match="delay_task: idempotency_lease is a task option"):
        delay_task.s(1).set(idempotency_lease=5).delay()


def test_a_misspelled_perform_once_option_raises_with_the_suggestion():
    with pytest.raises(errors.ConfigurationError) as caught:
        idempotent_job.perform_once("ChargeOrder", 1, lambda claim: 1, on_stael="hold")
    message = str(caught.value)
    assert message.startswith(
        "ChargeOrder: perform_once does not take on_stael (did you mean on_stale?) (it takes lease, payload"
    ), message
    with pytest.raises(errors.ConfigurationError, match="ChargeOrder: perform_once does not take scope"):
        idempotent_job.perform_once("ChargeOrder", 1, lambda claim: 1, scope="x")


def test_a_misspelled_setting_raises_with_the_suggestion():
    with pytest.raises(errors.ConfigurationError) as caught:
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"], leese=60)
    message = str(caught.value)
    assert message.startswith("unknown idempotent_job setting leese (did you mean lease?) (known: "), message
    assert "retention" in message and "pool_size" in message


def test_the_option_names_are_the_cores():
    assert _native.OPTION_NAMES[:3] == ("key", "scope", "lease")
    assert "transaction" not in _native.OPTION_NAMES
    assert _native.check_option("J", "", "on_stale", "hold") == "hold"
    with pytest.raises(errors.ConfigurationError, match="J: lease must be at least 0.25 s"):
        _native.check_option("J", "", "lease", 0.1)


def test_the_retention_default_is_the_cores():
    assert _native.DEFAULT_RETENTION == 2_592_000
    assert idempotent_job._current().defaults()["retention"] == _native.DEFAULT_RETENTION


def test_the_operating_calls_defaults_are_the_cores():
    # held's limit, purge's batch and the repeats' restart window are read from the core
    # (operations.rs, repeats/mod.rs), as the Ruby gem's IdempotentJob.held/purge/repeats.
    assert (_native.DEFAULT_HELD_LIMIT, _native.DEFAULT_PURGE_BATCH) == (100, 1000)
    assert (_native.DEFAULT_REPEATS_SINCE, _native.DEFAULT_RESTART_WINDOW) == (86_400, 120)
    ij = idempotent_job
    default = {
        (call.__name__, name): parameter.default
        for call in (ij.held, ij.purge, ij.repeats, ij.repeats_report)
        for name, parameter in inspect.signature(call).parameters.items()
    }
    assert default[("held", "limit")] is _native.DEFAULT_HELD_LIMIT
    assert default[("purge", "batch")] is _native.DEFAULT_PURGE_BATCH
    assert default[("repeats", "restart_window")] is _native.DEFAULT_RESTART_WINDOW
    assert default[("repeats_report", "restart_window")] is _native.DEFAULT_RESTART_WINDOW


def test_an_unencodable_result_is_recorded_and_not_run_again(scenario, caplog):
    runs = []

    def body(claim):
        runs.append(1)
        return {"at": object()}

    with caplog.at_level(logging.WARNING, logger="idempotent_job"):
        first = idempotent_job.perform_once("PyUnencodable", scenario, body, store_result=True)
    assert first.decision == "ran"
    record = idempotent_job.record("PyUnencodable", scenario)
    assert record["status"] == "completed" and record["result_state"] == "unencodable"
    assert any(
        "its result was not stored" in r.getMessage() and "object" in r.getMessage() for r in caplog.records
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="idempotent_job"):
        again = idempotent_job.perform_once("PyUnencodable", scenario, body, store_result=True)
    assert again.decision == "completed" and again.value is None and not again.replayed
    # The log line agrees with the outcome: no value was replayed (issue 34 item 5).
    skipped = [r.getMessage() for r in caplog.records if "duplicate delivery skipped" in r.getMessage()]
    assert skipped and all("no value replayed (result unencodable, not stored)" in m for m in skipped)
    assert not any("replayed: true" in r.getMessage() for r in caplog.records)
    assert runs == [1]


def _read_only(on: bool) -> None:
    import psycopg

    setting = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM {setting}")
        conn.execute("SELECT pg_reload_conf()")
    for _ in range(200):  # a new session shows the server has read it
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            if conn.execute("SHOW default_transaction_read_only").fetchone()[0] == ("on" if on else "off"):
                return
    raise AssertionError("the server did not apply default_transaction_read_only")


def test_find_on_a_read_only_server_answers_from_a_read_as_in_ruby(scenario):
    # The core's operations::find: a retryable failure to write the queued repeat counts
    # (the server is read-only in a failover) does not fail the read; they stay queued.
    # spec/faults/repeats_spec.rb asserts the same of IdempotentJob.record.
    idempotent_job.perform_once(scenario, "done", lambda claim: None)
    _read_only(True)
    try:
        outcome = idempotent_job.perform_once(scenario, "done", lambda claim: pytest.fail("a duplicate ran"))
        assert outcome.decision == "completed"
        found = idempotent_job.record(scenario, "done")
        assert (found["status"], found["duplicates"]) == ("completed", 0)
    finally:
        _read_only(False)
    idempotent_job._settle()
    assert idempotent_job.record(scenario, "done")["duplicates"] == 1


@pytest.mark.parametrize(
    ("declaration", "problem"),
    [
        ([], "is an empty list"),
        (-1, "uses a negative argument index -1"),
        (1.5, "has a part of type float: use a parameter name (str), an argument index (int)"),
        (True, "has a part of type bool"),
        ("order..id", "contains an empty name or path segment in 'order..id'"),
        ("missing", "names parameter 'missing', which key_shape_task does not have"),
    ],
)
def test_a_malformed_key_declaration_is_refused_by_the_cores_parse(declaration, problem):
    # The shape is the core's (crates/core/src/declaration.rs), worded with Python's
    # types; spec/unit/idempotent_job/key_spec.rb checks the same parse in Ruby's.
    with pytest.raises(errors.OperationKeyError) as caught:

        @app.task(base=IdempotentTask, name="key_shape_task", idempotency_key=declaration)
        def key_shape_task(order, carrier):
            return order

        key_shape_task.name  # noqa: B018 - evaluates a lazy task
    message = str(caught.value)
    assert message.startswith(f"key_shape_task: idempotency_key {declaration!r} {problem}"), message
    assert caught.value.declaration == declaration


def test_key_declarations_resolve_indexes_names_paths_and_composites():
    @app.task(base=IdempotentTask, name="key_paths_task", idempotency_key=["order.id", 1, "0.lines.1"])
    def key_paths_task(order, carrier):
        return order

    order = {"id": 7, "lines": ["a", "b"]}
    assert key_paths_task._operation_key((order, "ups"), {}) == '["7","ups","b"]'
    assert key_paths_task._operation_key((order, "dhl"), {}) == '["7","dhl","b"]'
