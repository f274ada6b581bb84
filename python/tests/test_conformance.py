"""The conformance vectors (conformance/vectors.json, docs/conformance.md) through the
Python door: its digests and canonical JSON, its operation keys and refusals, its delays,
and every decision case delivered by ``idempotent_job.perform_once`` on the suite's
PostgreSQL. The Ruby specs and the core's cargo tests read the same file: a door that
drifts fails."""

from __future__ import annotations

import json
import os
import uuid

import psycopg
import pytest
from conftest import ROOT

import idempotent_job
from idempotent_job import _native
from idempotent_job._door import call_start, key_of, parse_key
from idempotent_job.errors import OperationKeyError, PayloadMismatchError

VECTORS = json.loads((ROOT / "conformance" / "vectors.json").read_text(encoding="utf-8"))
JOB = "ConformanceJob"


def cases(section: str) -> list[dict]:
    return VECTORS[section]["cases"]


def names(section: str) -> list[str]:
    return [c["name"] for c in cases(section)]


def test_a_vectors_format_this_test_reads():
    assert VECTORS["format"] == 1


@pytest.mark.parametrize("case", cases("canonical"), ids=names("canonical"))
def test_canonical_json_and_digest(case):
    value = json.loads(case["json"])
    assert _native.args_digest(value) == case["digest"]
    if isinstance(value, (list, dict)) and value:
        # A non-empty list or map is its canonical JSON as an operation key.
        assert idempotent_job.operation_key(value) == case["canonical"]


def key_result(compute):
    try:
        return ("text", compute())
    except OperationKeyError as e:
        return ("refused", str(e))


def check_key(case, result):
    if "text" in case:
        assert result == ("text", case["text"])
    else:
        assert result[0] == "refused", result
        assert case["refused"] in result[1]


@pytest.mark.parametrize("case", cases("keys"), ids=names("keys"))
def test_operation_key(case):
    value = json.loads(case["json"])
    check_key(case, key_result(lambda: idempotent_job.operation_key(value, case.get("job_type", "Job"))))


@pytest.mark.parametrize("case", cases("composite_keys"), ids=names("composite_keys"))
def test_composite_operation_key(case):
    parts = json.loads(case["parts_json"])
    check_key(case, key_result(lambda: _native.Store.operation_key("Job", parts, True)))


@pytest.mark.parametrize("case", cases("key_paths"), ids=names("key_paths"))
def test_key_path(case):
    """The Celery door's reading of a declaration over positional arguments: the core's
    parse, the door's start of each part (``_door.call_start``), the core's resolve."""
    args = tuple(json.loads(case["args_json"]))
    declaration = case["declaration"]

    def refuse(problem: str) -> OperationKeyError:
        return OperationKeyError(f"Job: {problem}")

    def compute() -> str:
        paths = parse_key(declaration, refuse)
        starts = [call_start(path, args, {}, "the task") for path in paths]
        return key_of(
            "Job", declaration, starts, lambda part, problem: refuse(f"({paths[part][0]}): {problem}")
        )

    check_key(case, key_result(compute))


def test_key_path_reaches_an_int_dict_key_by_its_text():
    """A value key writes ``{1: "x"}`` as ``{"1":"x"}``, so a path segment reaches an int
    key by that text (the core's ``declaration::integer_key``), a str key of it first;
    never a bool or float key equal to it, nor by another text of the number."""

    def key(declaration: str, *args) -> str:
        def refuse(problem: str) -> OperationKeyError:
            return OperationKeyError(f"Job: {problem}")

        paths = parse_key(declaration, refuse)
        starts = [call_start(path, args, {}, "the task") for path in paths]
        return key_of("Job", declaration, starts, lambda part, problem: refuse(problem))

    assert idempotent_job.operation_key({1: "x"}, "Job") == '{"1":"x"}'
    assert key("0.1", {1: "x"}) == "x"
    assert key("1.0.-2.id", 7, {0: {-2: {"id": 9}}}) == "9"
    assert key(f"0.{2**70}", {2**70: "big"}) == "big"
    assert key("0.1", {1: "int", "1": "text"}) == "text"
    for declaration, value in [("0.01", {1: "x"}), ("0.1", {True: "x"}), ("0.1", {1.0: "x"})]:
        with pytest.raises(OperationKeyError, match="has no key"):
            key(declaration, value)


@pytest.mark.parametrize("case", VECTORS["delays"]["unreachable"], ids=lambda c: f"failures={c['failures']}")
def test_unreachable_delay(case):
    assert _native.unreachable_delay(case["failures"]) == case["delay"]


SECTION = VECTORS["decisions"]

# Where the Python door's outcome still differs from the core's (found by these vectors,
# 2026-12-04): the field and why. A case with a known drift is xfail(strict): pytest fails
# it the day the door agrees, so this list cannot outlive the drift.
KNOWN_DRIFT: dict[str, str] = {}


def deliver(key: str, payload, options: dict, deferrals: int = 0) -> dict:
    asked = []
    ran = []
    lookup = options["lookup"]

    def answer(_key):
        asked.append(True)
        return lookup

    try:
        outcome = idempotent_job.perform_once(
            JOB,
            key,
            lambda claim: ran.append(True),
            payload=payload,
            on_stale=options["on_stale"],
            on_mismatch=options["on_mismatch"],
            lookup=answer if lookup else None,
            heartbeat=False,
            deferrals=deferrals,
        )
    except PayloadMismatchError:
        return {
            "decision": None,
            "error": "payload_mismatch",
            "ran": bool(ran),
            "claim": None,
            "lookup_asked": bool(asked),
            "duplicates": None,
            "retry_after": None,
        }
    return {
        "decision": outcome.decision,
        "error": None,
        "ran": bool(ran),
        "claim": outcome.claim.kind if outcome.claim else None,
        "lookup_asked": bool(asked),
        "duplicates": outcome.duplicates,
        "retry_after": outcome.retry_after,
    }


def set_up(key: str, record: str) -> None:
    first = idempotent_job.perform_once(
        JOB, key, lambda claim: None, payload=SECTION["payload_a"], heartbeat=False
    )
    assert first.decision == "ran"
    setup = SECTION["setup"][record]
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        # The statement's $n placeholders as they are (libpq's own parameters).
        params = [str(p).encode() for p in (JOB, key, setup["status"], setup["lease_expires_in"])]
        result = conn.pgconn.exec_params(SECTION["setup_sql"].encode(), params)
        assert result.command_tuples == 1, result.error_message


@pytest.mark.parametrize("case", cases("decisions"), ids=names("decisions"))
def test_decision(case):
    if case["name"] in KNOWN_DRIFT:
        pytest.xfail(KNOWN_DRIFT[case["name"]])
    key = f"conformance-{uuid.uuid4()}"
    if case["record"] != "absent":
        set_up(key, case["record"])
    payload = SECTION["payload_a"] if case["payload"] == "same" else SECTION["payload_b"]
    got = deliver(key, payload, case["options"], case.get("deferrals", 0))
    record = idempotent_job.record(JOB, key)
    got["status_after"] = record["status"] if record else None
    assert got == case["expect"]
