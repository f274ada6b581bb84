"""Issue 29: values nested far deeper than any stack allows, as key, payload, facts and
result of the plain API. The core's limit (127 levels of lists and dicts, the deepest
serde_json reads) is judged while converting, never by recursing past it: before it,
a result nested 10,000 deep killed the process with SIGSEGV after the body ran, and the
operation stayed claimed to run again after the lease."""

from __future__ import annotations

import pytest

import idempotent_job
from idempotent_job import errors

LIMIT = 127


def nested(levels: int):
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_result_nested_100000_deep_completes_unstored_and_never_runs_again(scenario):
    runs = []

    def body(claim):
        runs.append(1)
        return nested(100_000)

    first = idempotent_job.perform_once("PyNested", scenario, body, store_result=True)
    assert first.decision == "ran"
    again = idempotent_job.perform_once("PyNested", scenario, body, store_result=True)
    assert again.decision == "completed" and again.value is None
    assert len(runs) == 1
    assert idempotent_job.record("PyNested", scenario)["status"] == "completed"


def test_a_result_at_the_limit_is_stored_and_replayed(scenario):
    idempotent_job.perform_once("PyNested", scenario, lambda claim: nested(LIMIT), store_result=True)
    again = idempotent_job.perform_once("PyNested", scenario, lambda claim: 1 / 0, store_result=True)
    assert again.decision == "completed" and again.replayed and again.value == nested(LIMIT)


@pytest.mark.parametrize(
    "what,options,error,text",
    [
        # Issue 30: the core's words (canonical::unwritable), the Ruby gem's too
        # (spec/replay/nesting_spec.rb); Python said "the payload holds …, which JSON cannot carry".
        ("payload", lambda v: {"payload": v}, errors.ConfigurationError, "^PyNested: the payload cannot be"),
        ("facts", lambda v: {"facts": {"x": v}}, errors.ConfigurationError, "^PyNested: the facts cannot be"),
    ],
)
def test_a_payload_or_facts_too_deep_is_refused_before_the_claim(scenario, what, options, error, text):
    with pytest.raises(error, match=text) as raised:
        too_deep = options(nested(100_000))
        idempotent_job.perform_once("PyNested", scenario, lambda claim: pytest.fail("ran"), **too_deep)
    assert f"{LIMIT} levels" in str(raised.value)
    assert idempotent_job.record("PyNested", scenario) is None


def test_payload_depth_agrees_with_ruby_127_taken_128_refused(scenario):
    at_limit = idempotent_job.perform_once("PyNested", scenario, lambda c: 1, payload=nested(LIMIT))
    assert at_limit.decision == "ran"
    with pytest.raises(errors.ConfigurationError, match=f"{LIMIT} levels"):
        idempotent_job.perform_once("PyNested", scenario + "b", lambda c: 1, payload=nested(LIMIT + 1))


def test_a_key_nested_100000_deep_is_refused_naming_the_job(scenario):
    refused = "PyNested: operation key: a value nested deeper than 127"
    with pytest.raises(errors.OperationKeyError, match=refused):
        idempotent_job.perform_once("PyNested", nested(100_000), lambda claim: pytest.fail("ran"))
