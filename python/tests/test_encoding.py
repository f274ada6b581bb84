"""Issue 29: text that is not valid UTF-8 (a lone surrogate, as ``surrogateescape``
decoding of foreign bytes leaves) as job type, key, payload or facts of every public call
is the library's error naming the job, and nothing runs or is recorded. Before, a job type
raised a bare UnicodeEncodeError from the binding."""

from __future__ import annotations

import pytest

import idempotent_job
from idempotent_job import errors

BAD = "ab\udcff"


def once(job_type, key, runs, **options):
    return idempotent_job.perform_once(job_type, key, lambda claim: runs.append(1), **options)


JOB_TYPE = r"^the job type 'ab\\udcff' is not valid UTF-8: .*nothing was run"


@pytest.mark.parametrize(
    "call",
    [
        lambda runs, key: once(BAD, key, runs),
        lambda runs, key: idempotent_job.record(BAD, key),
        lambda runs, key: idempotent_job.held(BAD),
        lambda runs, key: idempotent_job.resolve(BAD, key),
        lambda runs, key: idempotent_job.operation_key(key, BAD),
    ],
    ids=["perform_once", "record", "held", "resolve", "operation_key"],
)
def test_a_job_type_that_is_not_utf8_is_a_configuration_error_naming_it(scenario, call):
    runs: list[int] = []
    with pytest.raises(errors.ConfigurationError, match=JOB_TYPE):
        call(runs, scenario)
    assert runs == []


KEY, CONFIG = errors.OperationKeyError, errors.ConfigurationError


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda runs, key: once("PyEnc", BAD, runs), KEY),
        (lambda runs, key: once("PyEnc", [key, BAD], runs), KEY),
        (lambda runs, key: once("PyEnc", {BAD: 1}, runs), KEY),
        (lambda runs, key: once("PyEnc", key, runs, payload=[BAD]), CONFIG),
        (lambda runs, key: once("PyEnc", key, runs, payload={BAD: 1}), CONFIG),
        (lambda runs, key: once("PyEnc", key, runs, facts={"a": BAD}), CONFIG),
        (lambda runs, key: idempotent_job.record("PyEnc", BAD), KEY),
        (lambda runs, key: idempotent_job.resolve("PyEnc", BAD), KEY),
    ],
    ids=["key", "composite key", "dict key", "payload", "payload dict key", "facts", "record", "resolve"],
)
def test_a_key_payload_or_facts_that_is_not_utf8_is_the_librarys_error_naming_the_job(scenario, call, error):
    runs: list[int] = []
    with pytest.raises(error, match=r"^PyEnc: ") as raised:
        call(runs, scenario)
    # Said in the library's words, not Python's codec message.
    assert "is not valid UTF-8 (a lone surrogate" in str(raised.value), raised.value
    assert "UnicodeEncodeError" not in str(raised.value), raised.value
    assert runs == []
    assert idempotent_job.record("PyEnc", scenario) is None
