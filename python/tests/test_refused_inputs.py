"""Values a caller or producer may pass that the library once took wrongly (the hostile
probe of 2026-12-05, redone): each is refused with the library's ConfigurationError in
the core's words, naming the job and the range, before anything is claimed or run; or,
for an int subclass, read by its value. Against the suite's PostgreSQL; the Celery and
SQS doors' own cases are in test_celery_hostile.py and test_sqs.py."""

from __future__ import annotations

import datetime
import math
import os
import re
import time

import pytest

import idempotent_job
from idempotent_job import errors
from idempotent_job.sqs import batch_handler

WAIT = "wait must be a number of seconds from 0 to 315360000, got "
TIME = "must be epoch seconds from -62135596800 (0001-01-01) to 253402300799 (9999-12-31), got "


@pytest.mark.parametrize(
    "wait,shown",
    [
        (10**400, "1000000000"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-1, "-1"),
        (True, "True"),
        ("10", "'10'"),
    ],
    ids=["10**400", "nan", "inf", "-1", "True", "str"],
)
def test_a_wait_out_of_range_is_refused_in_the_cores_words(scenario, wait, shown):
    # Before: wait=10**400 raised pyo3's "OverflowError: int too large to convert to
    # float"; a bool or a str had Python's own wording, another than the core's.
    runs = []
    with pytest.raises(errors.ConfigurationError, match=f"^{scenario}: {re.escape(WAIT + shown)}"):
        idempotent_job.perform_once(scenario, "1", lambda c: runs.append(1), wait=wait)
    assert runs == []
    assert idempotent_job.record(scenario, "1") is None


@pytest.mark.parametrize(
    "arguments,name,shown",
    [
        ({"since": 10**400}, "since", "1000000000"),
        ({"since": math.nan}, "since", "nan"),
        ({"since": -math.inf}, "since", "-inf"),
        ({"since": 1e20}, "since", "1e+20"),
        ({"restarts": [math.nan]}, "restarts", "nan"),
        ({"restarts": [0, 10**400]}, "restarts", "1000000000"),
    ],
    ids=["since-10**400", "since-nan", "since-minus-inf", "since-1e20", "restarts-nan", "restarts-10**400"],
)
@pytest.mark.parametrize("call", ["repeats", "repeats_report"])
def test_a_report_time_out_of_range_is_refused_stating_the_range(call, arguments, name, shown):
    # Before: since=10**400 or restarts=[10**400] raised "OverflowError: int too large
    # to convert to float" from float(); NaN restarts were taken (matched to nothing).
    with pytest.raises(errors.ConfigurationError, match=f"^repeats: {name} {re.escape(TIME + shown)}"):
        getattr(idempotent_job, call)(**arguments)


def test_a_report_restart_window_beyond_the_float_range_is_refused():
    with pytest.raises(errors.ConfigurationError, match="^restart_window must be a finite number"):
        idempotent_job.repeats(restart_window=10**400)


@pytest.mark.parametrize("window", [True, False, None, "abc", "90", [1]], ids=repr)
def test_a_report_restart_window_that_is_no_number_is_refused_in_the_cores_words(window):
    # Before: True was taken as 1 s and False as 0, "90" as 90 s (float()); None and [1]
    # raised float()'s TypeError, "abc" its ValueError.
    words = f"restart_window must be a finite number of seconds, 0 or more, got {re.escape(repr(window))}"
    with pytest.raises(errors.ConfigurationError, match=f"^{words}$"):
        idempotent_job.repeats(restart_window=window)


def test_report_times_in_range_are_taken():
    since = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    assert isinstance(idempotent_job.repeats(since=since, restarts=[0, 946684800.5]), list)


class Named:
    def __str__(self) -> str:
        return "ChargeOrder"


@pytest.mark.parametrize(
    "job_type,shown", [(42, "int 42"), (b"x", "bytes b'x'"), (1.5, "float 1.5"), (Named(), "Named <")]
)
def test_a_job_type_that_is_not_a_str_is_refused_not_stringified(scenario, job_type, shown):
    # Before: str(job_type) made the job types "42", "b'x'", "1.5" and "ChargeOrder" (an
    # object's __str__): another record than the caller meant, silently.
    runs = []
    expected = f"^the job type must be a str, got {re.escape(shown)}.*nothing was run or recorded"
    calls = [
        lambda: idempotent_job.perform_once(job_type, scenario, lambda c: runs.append(1)),
        lambda: idempotent_job.operation_key(scenario, job_type),
        lambda: idempotent_job.record(job_type, scenario),
        lambda: idempotent_job.held(job_type),
        lambda: idempotent_job.resolve(job_type, scenario),
        lambda: idempotent_job.repeats(job_type=job_type),
        lambda: batch_handler(print, job_type=job_type, key="body.k"),
    ]
    for call in calls:
        with pytest.raises(errors.ConfigurationError, match=expected):
            call()
    assert runs == []
    for text in ("42", "b'x'", "1.5", "ChargeOrder"):
        assert idempotent_job.record(text, scenario) is None


def test_a_str_subclass_job_type_is_its_value(scenario):
    class Shown(str):
        def __str__(self) -> str:
            return "Other"

    outcome = idempotent_job.perform_once(Shown(scenario), "1", lambda c: c.job_type)
    assert outcome.value == scenario
    assert idempotent_job.record(scenario, "1")["status"] == "completed"


class Lying(int):
    """An int whose text (and comparison) is not its value's."""

    def __str__(self) -> str:
        return "7"

    def __repr__(self) -> str:
        return "7"

    def __index__(self) -> int:
        return 7

    def __lt__(self, other: object) -> bool:
        return False


class Garbled(int):
    def __str__(self) -> str:
        return "-"

    __repr__ = __str__


@pytest.mark.parametrize("kind", [Lying, Garbled])
@pytest.mark.parametrize(
    "value", [2**70, -(2**70), 2**64, 5, -3], ids=["2**70", "-2**70", "2**64", "5", "-3"]
)
def test_an_int_subclass_is_read_by_its_value_not_its_text(scenario, kind, value):
    # Before: a value beyond 64 bits was written by the subclass's __str__: Lying(2**70)
    # was the key "7" (another operation's record), Garbled(2**70) a refusal of the
    # integer text "-"; in a payload, the digest of that text.
    hostile = kind(value)
    assert idempotent_job.operation_key(hostile) == str(value)
    assert idempotent_job.operation_key({"n": hostile}) == f'{{"n":{value}}}'
    assert idempotent_job.operation_key([hostile, "a"]) == f'[{value},"a"]'
    assert idempotent_job._native.args_digest(
        [hostile, {"n": hostile}]
    ) == idempotent_job._native.args_digest([value, {"n": value}])
    assert idempotent_job.operation_key({hostile: 1}) == f'{{"{value}":1}}'
    outcome = idempotent_job.perform_once(scenario, hostile, lambda c: c.operation_key, payload=[hostile])
    assert outcome.value == str(value)
    assert idempotent_job.record(scenario, value)["status"] == "completed"


@pytest.mark.parametrize(
    "older_than,shown", [(10**400, "inf"), (-(10**400), "-inf")], ids=["10**400", "-10**400"]
)
def test_a_purge_age_beyond_the_float_range_is_refused_by_the_cores_rule(older_than, shown):
    # Before: pyo3's "OverflowError: int too large to convert to float".
    with pytest.raises(
        errors.ConfigurationError, match=f"^purge needs older_than >= 0 seconds .*, got {shown} and"
    ):
        idempotent_job.purge(older_than=older_than)


@pytest.mark.parametrize("older_than", [True, False, "30", [1]], ids=repr)
def test_a_purge_age_that_is_no_number_is_refused_in_the_cores_words(older_than):
    # Before: True was taken as 1 second (every record finished more than a second ago
    # deleted), "30" and [1] pyo3's TypeError 'must be real number'.
    key = f"purge-bool-{time.time_ns()}"
    idempotent_job.perform_once("PurgeBool", key, lambda c: 1)
    time.sleep(1.1)
    shown = re.escape(repr(older_than))
    words = f"purge needs older_than >= 0 seconds and a batch of at least 1, got {shown} and 1000"
    with pytest.raises(errors.ConfigurationError, match=f"^{words}$"):
        idempotent_job.purge(older_than=older_than)
    assert idempotent_job.record("PurgeBool", key) is not None


@pytest.mark.parametrize("older_than", [2**64, 1e300], ids=["2**64", "1e300"])
def test_a_purge_age_before_postgresqls_first_timestamp_deletes_nothing(older_than):
    # Before: DatabaseError 'timestamp out of range (SQLSTATE 22008)' (the statement's
    # now() - make_interval(secs => ...)); no record is older than 4714 BC.
    assert idempotent_job.purge(older_than=older_than) == 0


@pytest.mark.parametrize("value", [True, False, 1.5, 2.0, "5", None], ids=repr)
def test_a_limit_or_batch_that_is_not_an_int_is_refused_in_the_cores_words(value):
    # Before: held(limit=True) counted as 1 (a bool is an int to pyo3), 1.5 and "5" failed
    # with pyo3's TypeError rather than the core's ConfigurationError.
    shown = re.escape(repr(value))
    with pytest.raises(
        errors.ConfigurationError, match=rf"^held needs a limit of at least 1 \(up to \d+\), got {shown}$"
    ):
        idempotent_job.held(limit=value)
    with pytest.raises(
        errors.ConfigurationError,
        match=rf"^purge needs older_than >= 0 seconds and a batch of at least 1, got 1000000000 and {shown}$",
    ):
        idempotent_job.purge(older_than=10**9, batch=value)


def test_a_limit_or_batch_beyond_64_bits_is_no_limit():
    # Before: pyo3's "OverflowError: Python int too large to convert to C long".
    assert isinstance(idempotent_job.held(limit=10**400), list)
    assert isinstance(idempotent_job.purge(older_than=10**9, batch=10**400), int)
    with pytest.raises(
        errors.ConfigurationError, match="a batch of at least 1, got .* and -9223372036854775808"
    ):
        idempotent_job.purge(batch=-(10**400))


def test_a_record_holding_a_time_of_infinity_is_an_unreadable_record_error(scenario):
    # A time edited by hand to 'infinity' (no Python time holds it): the core's own class,
    # a ConfigurationError naming the record and the column (before: a bare
    # ConfigurationError, which a caller could not tell from a refused argument).
    import psycopg

    idempotent_job.perform_once(scenario, "1", lambda c: None)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
        c.execute(
            "UPDATE idempotent_job_records SET claimed_at = 'infinity' WHERE job_type = %s", (scenario,)
        )
    try:
        with pytest.raises(
            errors.UnreadableRecordError,
            match=f'^the record of {scenario} operation "1" cannot be read: its column claimed_at',
        ) as raised:
            idempotent_job.record(scenario, "1")
        assert isinstance(raised.value, errors.ConfigurationError)
        assert not raised.value.retryable
    finally:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
            c.execute("DELETE FROM idempotent_job_records WHERE job_type = %s", (scenario,))


def test_a_resolve_of_a_record_it_cannot_read_changes_nothing(scenario):
    # Before: the resolve settled the record (completed, resolution done) and only its
    # answer could not be read, so the caller got UnreadableRecordError for a change made.
    import psycopg

    idempotent_job.perform_once(scenario, "1", lambda c: None)
    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            "UPDATE idempotent_job_records SET status = 'held', held_at = '-infinity', completed_at = NULL "
            "WHERE job_type = %s",
            (scenario,),
        )
    try:
        with pytest.raises(errors.UnreadableRecordError, match="its column held_at"):
            idempotent_job.resolve(scenario, "1", as_="done")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("UPDATE idempotent_job_records SET held_at = now() WHERE job_type = %s", (scenario,))
        found = idempotent_job.record(scenario, "1")
        assert (found["status"], found["resolution"]) == ("held", None)
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("DELETE FROM idempotent_job_records WHERE job_type = %s", (scenario,))
