"""The plain Python API against the suite's PostgreSQL: the replay scenarios (the same
operation three times, five copies at once in forked processes, a process SIGKILLed
after its claim or after its effect, two distinct operations), each also without the
guard where it must show the duplicate effect; errors, payloads, operating calls."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import psycopg
import pytest
from conftest import eventually
from effects import effects, first_start_pid, record_effect, record_start

import idempotent_job
from idempotent_job import errors


def guarded(job_type: str, key: str, body, **options):
    return idempotent_job.perform_once(job_type, key, body, **options)


def unguarded(job_type: str, key: str, body, **options):
    return body(None)


@pytest.mark.parametrize("guard,expected", [(guarded, 1), (unguarded, 3)])
def test_same_operation_three_times(scenario, guard, expected):
    for _ in range(3):
        guard("PlainCharge", scenario, lambda claim: record_effect(scenario, "1"), payload=[scenario, 500])
    assert effects(scenario) == expected


def test_three_times_outcomes(scenario):
    outcomes = [
        idempotent_job.perform_once("PlainCharge", scenario, lambda claim: {"charge": claim.operation_key})
        for _ in range(3)
    ]
    assert [o.decision for o in outcomes] == ["ran", "completed", "completed"]
    assert outcomes[0].ran and outcomes[0].value == {"charge": scenario}
    assert outcomes[0].claim.kind == "first" and outcomes[0].claim.attempt == 1
    assert not outcomes[1].ran and outcomes[1].duplicates >= 1
    assert idempotent_job.record("PlainCharge", scenario)["status"] == "completed"


def _copy(scenario: str, guard_name: str, start: int, report: int) -> None:
    guard = guarded if guard_name == "guarded" else unguarded
    os.read(start, 1)  # every copy waits here until all five are forked

    def body(claim):
        record_effect(scenario, "1")
        time.sleep(0.5)

    outcome = guard("PlainCopies", scenario, body, lease=30)
    os.write(report, (getattr(outcome, "decision", "ran") + "\n").encode())


@pytest.mark.parametrize("guard_name,expected", [("guarded", 1), ("unguarded", 5)])
def test_five_copies_at_once_in_forked_processes(scenario, guard_name, expected):
    # Configured and used in this process (migrate), then used in five forked children:
    # each builds its own pool. (os.fork, not multiprocessing: other libraries' after-fork
    # hooks, e.g. a Celery app's, stay out of the children.)
    start_read, start_write = os.pipe()
    report_read, report_write = os.pipe()
    children = []
    for _ in range(5):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _copy(scenario, guard_name, start_read, report_write)
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    os.write(start_write, b"x" * 5)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    os.close(report_write)
    with os.fdopen(report_read) as reports:
        decisions = sorted(reports.read().split())
    for fd in (start_read, start_write):
        os.close(fd)
    assert codes == [0] * 5
    assert effects(scenario) == expected
    if guard_name == "guarded":
        assert decisions.count("ran") == 1
        assert set(decisions) <= {"ran", "in_progress", "completed"}


def _killable(scenario: str, on_stale: str, effect_first: bool, guard_name: str) -> None:
    guard = guarded if guard_name == "guarded" else unguarded

    def body(claim):
        starts = record_start(scenario, "1")
        if effect_first:
            record_effect(scenario, "1")
        if starts == 1:
            time.sleep(120)  # the test SIGKILLs this process here
        if not effect_first:
            record_effect(scenario, "1")

    guard("PlainKillable", scenario, body, lease=1, on_stale=on_stale)


def _run_until_settled(scenario: str, on_stale: str, effect_first: bool, guard_name: str):
    """Delivers again until the operation is no longer in progress (the killed claim's
    lease of 1 s ends), as a queue's redelivery would."""
    deferrals = 0
    while True:
        if guard_name == "unguarded":
            _killable(scenario, on_stale, effect_first, guard_name)
            return None
        outcome = idempotent_job.perform_once(
            "PlainKillable",
            scenario,
            lambda claim: _body_again(scenario, effect_first),
            lease=1,
            on_stale=on_stale,
            deferrals=deferrals,
        )
        if outcome.decision != "in_progress":
            return outcome
        assert outcome.retry_after is not None and outcome.retry_after > 0
        deferrals += 1
        time.sleep(outcome.retry_after)


def _body_again(scenario: str, effect_first: bool) -> None:
    record_start(scenario, "1")
    record_effect(scenario, "1")


def _kill_after_start(scenario: str, on_stale: str, effect_first: bool, guard_name: str) -> None:
    pid = os.fork()
    if pid == 0:  # the child: claims and is killed while its body runs
        try:
            _killable(scenario, on_stale, effect_first, guard_name)
        finally:
            os._exit(0)
    eventually(lambda: first_start_pid(scenario, "1"), "the child's body to start")
    if effect_first:  # killed after its effect, not between its start and its effect
        eventually(lambda: effects(scenario) >= 1, "the child's effect")
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.parametrize("guard_name,expected", [("guarded", 1), ("unguarded", 1)])
def test_sigkill_after_the_claim_runs_once_after_the_lease(scenario, guard_name, expected):
    _kill_after_start(scenario, "reclaim", False, guard_name)
    outcome = _run_until_settled(scenario, "reclaim", False, guard_name)
    assert effects(scenario) == expected
    if outcome is not None:
        assert outcome.decision == "ran" and outcome.claim.kind == "takeover"


@pytest.mark.parametrize("guard_name,expected", [("guarded", 1), ("unguarded", 2)])
def test_sigkill_after_the_effect_under_hold(scenario, guard_name, expected):
    _kill_after_start(scenario, "hold", True, guard_name)
    outcome = _run_until_settled(scenario, "hold", True, guard_name)
    assert effects(scenario) == expected
    if outcome is not None:
        assert outcome.decision == "held"
        assert ("PlainKillable", scenario) in idempotent_job.held("PlainKillable", 1000)
        assert idempotent_job.resolve("PlainKillable", scenario, as_="done") is True
        assert idempotent_job.resolve("PlainKillable", scenario, as_="done") is False
        again = idempotent_job.perform_once("PlainKillable", scenario, lambda c: record_effect(scenario, "1"))
        assert again.decision == "completed"
        assert effects(scenario) == 1


def test_a_held_operation_resolved_for_a_rerun_goes_to_the_registered_sender(scenario, caplog):
    # A plain caller's queue is its own: the sender it registers gets the stored
    # delivery (job class, queue, payload) and sends it; that delivery runs once, as a
    # retry. Control: with no sender the call says the operation was only released.
    _kill_after_start(scenario, "hold", True, "guarded")
    assert _run_until_settled(scenario, "hold", True, "guarded").decision == "held"
    sent = []
    sender = idempotent_job.on_rerun(
        lambda rerun: rerun.job_type == "PlainKillable" and not sent.append(rerun)
    )
    try:
        assert idempotent_job.resolve("PlainKillable", scenario, as_="rerun") is True
    finally:
        idempotent_job._senders.remove(sender)
    [rerun] = sent
    assert (rerun.job_type, rerun.operation_key, rerun.args) == ("PlainKillable", scenario, [])
    outcome = idempotent_job.perform_once(
        "PlainKillable", rerun.operation_key, lambda c: record_effect(scenario, "1")
    )
    assert (outcome.decision, outcome.claim.kind) == ("ran", "retry")
    assert effects(scenario) == 2

    other = scenario + "-none"
    _kill_after_start(other, "hold", True, "guarded")
    assert _run_until_settled(other, "hold", True, "guarded").decision == "held"
    with caplog.at_level("WARNING", logger="idempotent_job"):
        assert idempotent_job.resolve("PlainKillable", other, as_="rerun") is True
    assert "released only; no sender registered with idempotent_job.on_rerun" in caplog.text
    assert idempotent_job.record("PlainKillable", other)["status"] == "released"


def test_a_rerun_of_a_record_with_no_stored_job_is_refused_and_it_stays_held(scenario):
    # Only the delivery that takes a stale claim over stores its job (what a rerun
    # re-sends); a record held by other means (here by hand, after a first delivery)
    # has none: the rerun is refused naming the operation, nothing is sent, the record
    # stays held, and resolving it as done still works.
    idempotent_job.perform_once("PlainHeldByHand", scenario, lambda c: None)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
        c.execute(
            "UPDATE idempotent_job_records SET status = 'held', held_at = now() "
            "WHERE job_type = 'PlainHeldByHand' AND operation_key = %s",
            (scenario,),
        )
    sent = []
    sender = idempotent_job.on_rerun(lambda rerun: not sent.append(rerun))
    try:
        with pytest.raises(
            errors.ConfigurationError, match=f'cannot rerun PlainHeldByHand operation "{scenario}"'
        ):
            idempotent_job.resolve("PlainHeldByHand", scenario, as_="rerun")
    finally:
        idempotent_job._senders.remove(sender)
    assert sent == []
    assert idempotent_job.record("PlainHeldByHand", scenario)["status"] == "held"
    assert idempotent_job.resolve("PlainHeldByHand", scenario, as_="done") is True
    assert idempotent_job.record("PlainHeldByHand", scenario)["status"] == "completed"


def test_the_record_dict_has_the_cores_fields_stored_job_and_job_classes_included(scenario):
    # The record's fields are the core's (its Record: the Ruby Record has the same
    # members): `stored_job` is the core's one rule (what a rerun needs: only a takeover
    # stores the job), `job_classes` every class that delivered the operation, `args`
    # and `result` parsed from their JSON.
    def exits(claim):
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        idempotent_job.perform_once("PlainStoredJob", scenario, exits, lease=0.25, job_class="FirstJob")
    record = idempotent_job.record("PlainStoredJob", scenario)
    assert (record["stored_job"], record["job_class"], record["args"], record["job_classes"]) == (
        False,
        None,
        None,
        ["FirstJob"],
    )
    time.sleep(0.35)
    outcome = idempotent_job.perform_once(
        "PlainStoredJob",
        scenario,
        lambda c: {"taken": c.kind},
        on_stale="reclaim",
        job_class="TakerJob",
        queue="critical",
        payload=[1, {"a": "b"}],
        store_result=True,
    )
    assert (outcome.decision, outcome.claim.kind) == ("ran", "takeover")
    record = idempotent_job.record("PlainStoredJob", scenario)
    assert (record["stored_job"], record["job_class"], record["queue"], record["args"]) == (
        True,
        "TakerJob",
        "critical",
        [1, {"a": "b"}],
    )
    assert record["job_classes"] == ["FirstJob", "TakerJob"]
    assert (record["result"], record["result_state"]) == ({"taken": "takeover"}, "stored")
    assert "args_json" not in record and "result_json" not in record


def test_sigkill_after_the_effect_under_reclaim_is_the_documented_duplicate(scenario):
    _kill_after_start(scenario, "reclaim", True, "guarded")
    outcome = _run_until_settled(scenario, "reclaim", True, "guarded")
    assert outcome.decision == "ran" and outcome.claim.kind == "takeover"
    assert effects(scenario) == 2


def test_sigkill_after_the_effect_under_skip_gives_up(scenario):
    _kill_after_start(scenario, "skip", True, "guarded")
    outcome = _run_until_settled(scenario, "skip", True, "guarded")
    assert outcome.decision == "given_up"
    assert effects(scenario) == 1


@pytest.mark.parametrize("guard", [guarded, unguarded])
def test_two_distinct_operations_both_run(scenario, guard):
    for n in ("1", "2"):
        guard("PlainDistinct", f"{scenario}-{n}", lambda claim, n=n: record_effect(scenario, n))
    assert effects(scenario, "1") == 1 and effects(scenario, "2") == 1


def test_a_raising_body_releases_its_claim_and_reraises(scenario):
    def fails(claim):
        raise ValueError("gateway down")

    with pytest.raises(ValueError, match="gateway down"):
        idempotent_job.perform_once("PlainRaise", scenario, fails)
    record = idempotent_job.record("PlainRaise", scenario)
    assert record["status"] == "released" and "ValueError: gateway down" in record["last_error"]
    again = idempotent_job.perform_once("PlainRaise", scenario, lambda claim: claim.kind)
    assert again.decision == "ran" and again.value == "retry"


def test_a_body_error_holding_a_nul_is_released_not_left_claimed(scenario):
    # PostgreSQL text cannot hold U+0000: the release used to fail, leaving the claim for
    # its lease (then held for a person under on_stale="hold").
    def fails(claim):
        raise ValueError("bad\0byte")

    with pytest.raises(ValueError):
        idempotent_job.perform_once("PlainNul", scenario, fails, on_stale="hold")
    record = idempotent_job.record("PlainNul", scenario)
    assert record["status"] == "released" and record["last_error"] == "ValueError: bad\ufffdbyte"
    again = idempotent_job.perform_once("PlainNul", scenario, lambda claim: 1, on_stale="hold")
    assert again.decision == "ran"


def test_a_wait_past_the_clock_is_no_panic(scenario):
    # A wait no Duration holds used to panic in the core (PanicException, a BaseException).
    inside, finish = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=idempotent_job.perform_once,
        args=("PlainHugeWait", scenario, lambda claim: (inside.set(), finish.wait(30))),
    )
    holder.start()
    try:
        assert inside.wait(30)
        with pytest.raises(errors.ConfigurationError, match=r"^PlainHugeWait: wait must be"):
            idempotent_job.perform_once("PlainHugeWait", scenario, lambda claim: 1, wait=1e300)
    finally:
        finish.set()
        holder.join(30)
    assert idempotent_job.record("PlainHugeWait", scenario)["status"] == "completed"


def test_a_body_that_returns_a_coroutine_or_generator_is_refused_not_completed(scenario):
    # An async def (or generator) body returns without running its code: completing it
    # would record an effect that never happened, and every later delivery would skip.
    ran = []

    async def coroutine_body(claim):
        ran.append("coroutine")

    def generator_body(claim):
        ran.append("generator")
        yield

    async def async_generator_body(claim):
        ran.append("async generator")
        yield

    for n, body in enumerate([coroutine_body, generator_body, async_generator_body]):
        key = f"{scenario}-{n}"
        with pytest.raises(errors.ConfigurationError, match=r"^PlainAsync: the body returned a "):
            idempotent_job.perform_once("PlainAsync", key, body)
        assert idempotent_job.record("PlainAsync", key)["status"] == "released"
        again = idempotent_job.perform_once("PlainAsync", key, lambda claim: "ran")
        assert again.decision == "ran" and again.value == "ran"
    assert ran == []


def test_system_exit_in_the_body_keeps_the_claim(scenario):
    def exits(claim):
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        idempotent_job.perform_once("PlainExit", scenario, exits, lease=60)
    assert idempotent_job.record("PlainExit", scenario)["status"] == "claimed"
    outcome = idempotent_job.perform_once("PlainExit", scenario, lambda c: 1, lease=60)
    assert outcome.decision == "in_progress" and 0 < outcome.retry_after <= 2


def test_equal_payloads_give_equal_digests(scenario):
    first = idempotent_job.perform_once(
        "PlainPayload", scenario, lambda c: 1, payload=[2.0, {"a": 1, "b": [1.0, "x"]}], on_mismatch="raise"
    )
    assert first.ran
    digest = idempotent_job.record("PlainPayload", scenario)["args_digest"]
    again = idempotent_job.perform_once(
        "PlainPayload", scenario, lambda c: 1, payload=[2, {"b": [1, "x"], "a": 1}], on_mismatch="raise"
    )
    assert again.decision == "completed"
    record = idempotent_job.record("PlainPayload", scenario)
    assert record["args_digest"] == digest and record["mismatches"] == 0


def test_a_different_payload_is_refused_under_raise(scenario):
    with pytest.raises(RuntimeError):
        idempotent_job.perform_once("PlainMismatch", scenario, _raise, payload=[1])
    with pytest.raises(errors.PayloadMismatchError) as caught:
        idempotent_job.perform_once("PlainMismatch", scenario, lambda c: 1, payload=[2], on_mismatch="raise")
    assert caught.value.job_type == "PlainMismatch" and caught.value.operation_key == scenario
    assert isinstance(caught.value, idempotent_job.IdempotentJobError)


def _raise(claim):
    raise RuntimeError("first attempt fails")


def test_lookup_done_completes_a_stale_claim_without_running(scenario):
    _kill_after_start(scenario, "hold", True, "guarded")
    asked = []

    def lookup(key):
        asked.append(key)
        return "done"

    time.sleep(1.1)  # the killed claim's lease of 1 s
    outcome = idempotent_job.perform_once(
        "PlainKillable", scenario, lambda c: record_effect(scenario, "1"), lease=1, lookup=lookup
    )
    if outcome.decision == "in_progress":
        time.sleep(outcome.retry_after)
        outcome = idempotent_job.perform_once(
            "PlainKillable", scenario, lambda c: record_effect(scenario, "1"), lease=1, lookup=lookup
        )
    assert outcome.decision == "completed" and asked == [scenario]
    assert effects(scenario) == 1


@pytest.mark.parametrize(
    "key,problem",
    [(None, "None"), ("", "empty"), (1.5, "float"), (True, "bool"), ([], "empty"), ("a\0b", "NUL")],
)
def test_bad_keys_raise_operation_key_error(key, problem):
    with pytest.raises(errors.OperationKeyError, match=problem):
        idempotent_job.perform_once("PlainKey", key, lambda c: 1)


def test_key_texts_match_the_ruby_gems():
    assert idempotent_job.operation_key(42) == "42"
    assert idempotent_job.operation_key("ord-1") == "ord-1"
    assert idempotent_job.operation_key('{"x"') == '"{\\"x\\""'
    assert idempotent_job.operation_key({"b": 1, "a": 2.0}) == '{"a":2,"b":1}'


def test_bad_options_and_settings_raise_configuration_error():
    with pytest.raises(errors.ConfigurationError, match="PlainOpt.*on_stale"):
        idempotent_job.perform_once("PlainOpt", "1", lambda c: 1, on_stale="sometimes")
    with pytest.raises(errors.ConfigurationError, match="PlainOpt: lease"):
        idempotent_job.perform_once("PlainOpt", "1", lambda c: 1, lease=0.1)
    with pytest.raises(errors.ConfigurationError, match="bogus"):
        idempotent_job.configure(bogus=1)
    with pytest.raises(errors.ConfigurationError):
        idempotent_job.resolve("PlainOpt", "1", as_="maybe")
    # Issue 29: a value of the wrong type names the setting and what it must be (it said
    # "expected usize at line 1 column 84"; wait="5" was a bare TypeError).
    # Issue 30: the core's rule and words for the setting, as the Ruby gem's.
    with pytest.raises(
        errors.ConfigurationError,
        match=r"^pool_size must be a whole number from 1 to 262143 \(PostgreSQL's most connections\), "
        r'got "5"$',
    ):
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"], pool_size="5")
    with pytest.raises(errors.ConfigurationError, match="PlainOpt: wait must be a number of seconds"):
        idempotent_job.perform_once("PlainOpt", "1", lambda c: 1, wait="5")
    with pytest.raises(errors.ConfigurationError, match='scheme "postgress"'):
        idempotent_job.configure(database_url="postgress://app@db/app")


def test_connection_settings_are_checked_by_the_cores_rule_in_the_ruby_gems_words():
    """Issue 30: one rule and one wording per connection setting in both languages
    (spec/unit/idempotent_job/configuration_spec.rb checks the same); connect_timeout
    has the ten-year cap of every duration (it had none: past tokio's Instant range a
    timeout never fires, and above u64::MAX seconds the core panicked)."""
    url = os.environ["DATABASE_URL"]
    for name, value, expected in [
        ("connect_timeout", 315_360_001, "a positive number of seconds up to 315360000 (ten years)"),
        ("checkout_timeout", 0, "a positive number of seconds up to 315360000 (ten years)"),
        ("deadline", 3_000_000, "a positive number of seconds up to 2147483 (PostgreSQL's limit)"),
        ("pool_size", 0, "a whole number from 1 to 262143 (PostgreSQL's most connections)"),
        ("max_result_bytes", 268_435_456, "a whole number from 1 to 268435455 (jsonb's limit)"),
        ("compatibility", "cockroach", "one of postgresql, distributed"),
    ]:
        shown = json.dumps(value)
        with pytest.raises(errors.ConfigurationError) as caught:
            idempotent_job.configure(database_url=url, **{name: value})
        assert str(caught.value) == f"{name} must be {expected}, got {shown}"
    with pytest.raises(errors.ConfigurationError, match=r"^connect_timeout must be .* got 1e\+20$"):
        idempotent_job.configure(database_url=url, connect_timeout=1e20)
    with pytest.raises(errors.ConfigurationError, match=r"^password must be a string, got \[REDACTED\]$"):
        idempotent_job.configure(database_url=url, password=12345)
    idempotent_job.configure(database_url=url, connect_timeout=315_360_000)


def test_a_setting_no_json_can_carry_is_refused_naming_it():
    """configure(connect_timeout=nan) said only 'configure: expected value at line 1 column
    91' (naming no setting); password=b"..." or a set raised json's bare TypeError 'Object
    of type bytes is not JSON serializable'."""
    url = os.environ["DATABASE_URL"]
    for name, value, shown in [
        ("connect_timeout", float("nan"), "nan"),
        ("lease", float("inf"), "inf"),
        ("password", b"s3cret", "bytes"),
        ("sslmode", {"require"}, "set"),
    ]:
        with pytest.raises(errors.ConfigurationError) as caught:
            idempotent_job.configure(database_url=url, **{name: value})
        message = str(caught.value)
        assert message.startswith(f"{name} must be"), message
        assert shown in message, message
        assert "s3cret" not in message, message
    idempotent_job.configure(database_url=url)


def test_seconds_as_a_decimal_or_fraction_are_taken():
    """lease=Decimal("2.5") was refused: 'lease must be a positive number of seconds ...,
    got Decimal('2.5')' (the Ruby gem now takes BigDecimal, Rational and 10.minutes alike).
    A timedelta is its total_seconds()."""
    import datetime
    import decimal
    import fractions

    url = os.environ["DATABASE_URL"]
    idempotent_job.configure(
        database_url=url, lease=decimal.Decimal("300"), connect_timeout=fractions.Fraction(3, 2)
    )
    try:
        key = f"dec-{time.time_ns()}"
        for lease in (decimal.Decimal("2.5"), fractions.Fraction(7, 2)):
            outcome = idempotent_job.perform_once("PlainSeconds", f"{key}-{lease}", lambda c: 1, lease=lease)
            assert outcome.decision == "ran"
        minutes = f"{key}-timedelta"
        lease = datetime.timedelta(minutes=1.5)
        idempotent_job.perform_once("PlainSeconds", minutes, lambda c: 1, lease=lease)
        assert idempotent_job.record("PlainSeconds", minutes)["lease_seconds"] == 90
        idempotent_job.configure(database_url=url, lease=datetime.timedelta(minutes=2))
        idempotent_job.perform_once("PlainSeconds", f"{minutes}-default", lambda c: 1)
        assert idempotent_job.record("PlainSeconds", f"{minutes}-default")["lease_seconds"] == 120
        with pytest.raises(errors.ConfigurationError, match=r"lease must be .*, got Decimal\('-1'\)$"):
            idempotent_job.perform_once("PlainSeconds", key, lambda c: 1, lease=decimal.Decimal("-1"))
    finally:
        idempotent_job.configure(database_url=url)


def test_every_seconds_argument_takes_a_timedelta_decimal_or_fraction():
    """wait, purge's older_than and repeats' restart_window took only an int or a float
    (wait: 'wait must be a number of seconds ..., got Decimal('30')'; purge: pyo3's
    TypeError 'must be real number, not datetime.timedelta'; restart_window: float()'s
    TypeError), where lease and every setting take them (as the Ruby gem takes 10.minutes)."""
    import datetime
    import decimal
    import fractions

    key = f"secs-{time.time_ns()}"
    for wait in (datetime.timedelta(seconds=1), decimal.Decimal("0.5"), fractions.Fraction(1, 2)):
        outcome = idempotent_job.perform_once("PlainSeconds", f"{key}-{wait!r}", lambda c: 1, wait=wait)
        assert outcome.decision == "ran"
    assert idempotent_job.purge(older_than=datetime.timedelta(days=3650)) >= 0
    assert idempotent_job.purge(older_than=decimal.Decimal("315360000")) >= 0
    window = datetime.timedelta(minutes=5)
    assert isinstance(idempotent_job.repeats(job_type="PlainSeconds", restart_window=window), list)


@pytest.mark.parametrize(
    "value,shown",
    [
        (__import__("decimal").Decimal("sNaN"), "Decimal('sNaN')"),
        (__import__("fractions").Fraction(10**400), "Fraction(1000"),
        (__import__("fractions").Fraction(-(10**400), 3), "Fraction(-1000"),
    ],
    ids=["sNaN", "fraction-beyond-float", "negative-fraction-beyond-float"],
)
def test_seconds_no_float_holds_are_refused_in_the_cores_words(value, shown):
    """A Decimal sNaN raised float()'s ValueError ('cannot convert signaling NaN to float'),
    a Fraction beyond the float range its OverflowError, from configure, perform_once's
    lease and max_run, purge and repeats: each is now the rule's ConfigurationError."""
    url = os.environ["DATABASE_URL"]
    try:
        with pytest.raises(errors.ConfigurationError, match="^lease must be"):
            idempotent_job.configure(database_url=url, lease=value)
    finally:
        idempotent_job.configure(database_url=url)
    for option in ("lease", "max_run"):
        words = f"^PlainSeconds: {option} must be .*, got {re.escape(shown)}"
        with pytest.raises(errors.ConfigurationError, match=words):
            idempotent_job.perform_once("PlainSeconds", "never", lambda c: 1, **{option: value})
    with pytest.raises(errors.ConfigurationError, match="^PlainSeconds: wait must be"):
        idempotent_job.perform_once("PlainSeconds", "never", lambda c: 1, wait=value)
    with pytest.raises(errors.ConfigurationError, match="^purge needs older_than"):
        idempotent_job.purge(older_than=value)
    with pytest.raises(errors.ConfigurationError, match="^restart_window must be"):
        idempotent_job.repeats(restart_window=value)
    assert idempotent_job.record("PlainSeconds", "never") is None


def test_an_empty_idempotent_job_database_url_falls_to_database_url(monkeypatch):
    """The core's rule (config::env_database_url), the Ruby gem's too."""
    monkeypatch.setenv("IDEMPOTENT_JOB_DATABASE_URL", "")
    with pytest.raises(errors.ConfigurationError, match="IDEMPOTENT_JOB_DATABASE_URL / DATABASE_URL"):
        monkeypatch.setenv("DATABASE_URL", "")
        idempotent_job.configure()


@pytest.mark.parametrize(
    "argument,value,words",
    [
        ("facts", [1], "facts must be a dict (or None)"),
        ("facts", "receive_count=2", "facts must be a dict (or None)"),
        ("id", 123, "id must be a str (or None)"),
        ("job_class", 5, "job_class must be a str (or None)"),
        ("queue", 5, "queue must be a str (or None)"),
        ("deferrals", "1", "deferrals must be a whole number from 0 to 4294967295"),
        ("deferrals", -1, "deferrals must be a whole number from 0 to 4294967295"),
        ("deferrals", 2**32, "deferrals must be a whole number from 0 to 4294967295"),
        ("deferrals", True, "deferrals must be a whole number from 0 to 4294967295"),
    ],
)
def test_a_delivery_argument_of_the_wrong_kind_names_the_job_and_nothing_runs(
    scenario, argument, value, words
):
    # Fresh-clone trial: these were pyo3's own TypeError ("argument 'facts': 'list' object
    # cannot be cast as 'dict'") or, for deferrals=-1, "OverflowError: out of range
    # integral type conversion attempted", naming neither the job nor what to pass.
    runs = []
    expected = f"^{scenario}: perform_once's {re.escape(words)}, got "
    with pytest.raises(errors.ConfigurationError, match=expected):
        idempotent_job.perform_once(scenario, "1", lambda c: runs.append(1), **{argument: value})
    assert runs == []
    assert idempotent_job.record(scenario, "1") is None


class _LyingInt(int):
    """An int that says it is in every range (a hostile subclass's comparisons)."""

    def __le__(self, other):
        return True

    def __ge__(self, other):
        return True

    def __lt__(self, other):
        return False

    def __gt__(self, other):
        return False


def test_a_deferral_count_is_read_by_the_cores_rule_not_by_its_own_comparisons(scenario):
    # The range is the core's (protocol::delivery_count), read from the int's value:
    # Python restating it with the value's own comparisons let _LyingInt(-1) through to
    # the native call ("OverflowError: can't convert negative int to unsigned").
    runs = []
    expected = f"^{scenario}: perform_once's deferrals must be a whole number from 0 to 4294967295, got -1; "
    with pytest.raises(errors.ConfigurationError, match=expected):
        idempotent_job.perform_once(scenario, "1", lambda c: runs.append(1), deferrals=_LyingInt(-1))
    assert runs == []
    assert idempotent_job.record(scenario, "1") is None


def test_a_job_type_of_none_is_refused_not_stored_as_the_text_none(scenario):
    runs = []
    with pytest.raises(errors.ConfigurationError, match="the job type must be given"):
        idempotent_job.perform_once(None, scenario, lambda c: runs.append(1))
    with pytest.raises(errors.ConfigurationError, match="the job type must be given"):
        idempotent_job.record(None, scenario)
    assert runs == []
    assert idempotent_job.record("None", scenario) is None


def test_connection_errors_are_retryable_and_nothing_runs(scenario):
    idempotent_job.configure(database_url="postgres://nobody@127.0.0.1:1/none", connect_timeout=1, deadline=2)
    try:
        with pytest.raises(errors.ConnectionError) as caught:
            idempotent_job.perform_once("PlainDown", scenario, lambda c: record_effect(scenario, "1"))
        assert caught.value.retryable is True
    finally:
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
    assert effects(scenario) == 0


def test_a_missing_table_names_the_migration(scenario):
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"], schema="py_no_such_schema")
    try:
        with pytest.raises(errors.DatabaseError) as caught:
            idempotent_job.perform_once("PlainNoTable", scenario, lambda c: 1)
        assert caught.value.sqlstate is not None
    finally:
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"])


def _lock_record(job_type: str, key: str) -> psycopg.Connection:
    """A connection whose open transaction holds the record's row lock."""
    locker = psycopg.connect(os.environ["DATABASE_URL"])
    locker.execute(
        "SELECT 1 FROM idempotent_job_records WHERE job_type = %s AND operation_key = %s FOR UPDATE",
        (job_type, key),
    )
    return locker


class Alarm(Exception):
    pass


def test_a_signal_interrupts_a_blocked_statement(scenario):
    # A released record whose row another transaction holds locked: the claim statement
    # waits on the lock (the deadline is set far beyond the test). SIGALRM's handler
    # raises on the main thread; the blocked call gives up, its statement is cancelled,
    # and the handler's exception is raised: the record is untouched (attempts 1, the
    # first failure's error). Without the interrupt the statement would wait until a
    # safety thread ends the lock after 15 s, then claim and run the body (attempts 2).
    with pytest.raises(RuntimeError):
        idempotent_job.perform_once("PlainBlocked", scenario, _raise)
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"], deadline=120)
    locker = _lock_record("PlainBlocked", scenario)
    released = threading.Event()

    def safety():
        if not released.wait(15):
            with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (locker.info.backend_pid,))

    guard = threading.Thread(target=safety)
    guard.start()

    def alarm(signum, frame):
        raise Alarm()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(Alarm):
            idempotent_job.perform_once("PlainBlocked", scenario, lambda c: record_effect(scenario, "1"))
        # The given-up statement is cancelled: no backend waits on the lock any more.
        eventually(lambda: not _waiting_on_lock(), "the interrupted statement to be cancelled")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        released.set()
        guard.join()
        try:
            locker.rollback()
        except psycopg.Error:
            pass
        locker.close()
        idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
    record = idempotent_job.record("PlainBlocked", scenario)
    assert record["attempts"] == 1 and "first attempt fails" in record["last_error"], record
    assert effects(scenario) == 0
    outcome = idempotent_job.perform_once("PlainBlocked", scenario, lambda c: record_effect(scenario, "1"))
    assert outcome.ran and effects(scenario) == 1


def test_other_threads_run_while_a_statement_waits(scenario):
    # The GIL is released during the blocked claim: a Python thread keeps counting.
    with pytest.raises(RuntimeError):
        idempotent_job.perform_once("PlainGil", scenario, _raise)
    locker = _lock_record("PlainGil", scenario)
    counted = []
    done = threading.Event()

    def claim():
        idempotent_job.perform_once("PlainGil", scenario, lambda c: None)
        done.set()

    worker = threading.Thread(target=claim)
    worker.start()
    eventually(lambda: _waiting_on_lock(), "the claim to wait on the row lock")
    for i in range(1000):
        counted.append(i)
    assert not done.is_set()
    locker.rollback()
    locker.close()
    worker.join(30)
    assert done.is_set() and len(counted) == 1000


def _waiting_on_lock() -> bool:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%idempotent_job_records%'"
        ).fetchone()
        return row[0] > 0


def test_purge_deletes_finished_records_only(scenario):
    idempotent_job.perform_once("PlainPurge", scenario, lambda c: 1)
    with pytest.raises(RuntimeError):
        idempotent_job.perform_once("PlainPurge", scenario + "-released", _raise)
    assert idempotent_job.purge(older_than=0) >= 1
    assert idempotent_job.record("PlainPurge", scenario) is None
    assert idempotent_job.record("PlainPurge", scenario + "-released")["status"] == "released"
