"""One record across languages: the Ruby gem's plain API (`IdempotentJob.perform_once`,
run by `ruby -Ilib` from this checkout, with its compiled extension: `rake compile`)
and this package's, with the same job type and key, see one record; equal payloads
(2.0 in Python, 2.0 in Ruby; hashes in different orders) give equal digests, so
`on_mismatch="raise"` finds no mismatch."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import ROOT, eventually
from effects import effects, record_effect

import idempotent_job

RUBY = """
require "idempotent_job"
require "json"
IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"))
job_type, key, payload = ARGV[0], ARGV[1], JSON.parse(ARGV[2])
key = Integer(key) if key.match?(/\\A\\d+\\z/)
outcome = IdempotentJob.perform_once(job_type, key, payload: payload, on_mismatch: :raise) do |claim|
  "ruby ran #{claim.operation_key}"
end
IdempotentJob.settle_repeats if IdempotentJob.respond_to?(:settle_repeats)
puts JSON.generate(decision: outcome.decision, value: outcome.value)
"""


def ruby_script(script: str, *args: str) -> str:
    """Runs `script` with `ruby -Ilib` from this checkout (the gem and its compiled
    extension) and returns its standard output; fails the test when it fails."""
    if not list((ROOT / "lib" / "idempotent_job").glob("*.so")):
        pytest.fail("the Ruby extension is not built: run `rake compile` first")
    done = subprocess.run(
        ["ruby", "-Ilib", "-e", script, *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def ruby(job_type: str, key: str, payload) -> dict:
    out = ruby_script(RUBY, job_type, key, json.dumps(payload))
    return json.loads(out.strip().splitlines()[-1])


PYTHON_PAYLOAD = [42, 2.0, {"b": 1, "a": "x"}]


def python(scenario: str, key: str):
    def body(claim):
        record_effect(scenario, key)

    return idempotent_job.perform_once(
        "CrossOrder", int(key), body, payload=PYTHON_PAYLOAD, on_mismatch="raise"
    )


RUBY_PAYLOAD = [42, 2.0, {"a": "x", "b": 1}]


def test_ruby_first_then_python(scenario):
    key = str(abs(hash(scenario)) % 10**12)
    assert ruby("CrossOrder", key, RUBY_PAYLOAD)["decision"] == "ran"
    outcome = python(scenario, key)
    assert outcome.decision == "completed"
    assert effects(scenario) == 0
    record = idempotent_job.record("CrossOrder", int(key))
    # Ruby's first claim stored no job (a takeover stores it); the digests agreed.
    assert record["job_class"] is None and record["mismatches"] == 0


def test_python_first_then_ruby(scenario):
    key = str(abs(hash(scenario)) % 10**12)
    first = python(scenario, key)
    assert first.ran
    assert ruby("CrossOrder", key, RUBY_PAYLOAD)["decision"] == "completed"
    record = idempotent_job.record("CrossOrder", int(key))
    assert record["mismatches"] == 0 and record["attempts"] == 1
    assert effects(scenario) == 1


RUBY_RECORD = """
require "idempotent_job"
require "json"
IdempotentJob.configure(database_url: ENV.fetch("DATABASE_URL"))
record = IdempotentJob.record(ARGV[0], ARGV[1])
puts JSON.generate(record.to_h.transform_values { |v| v.is_a?(Time) ? v.to_f : v })
"""


def test_ruby_and_python_read_a_record_with_the_same_fields_and_values(scenario):
    # Both bindings convert the core's one Record: the same names, the same values
    # (times as epoch seconds, Ruby's Symbols as text), stored_job and job_classes included.
    key = str(abs(hash(scenario)) % 10**12)
    assert ruby("CrossOrder", key, RUBY_PAYLOAD)["decision"] == "ran"
    from_ruby = json.loads(ruby_script(RUBY_RECORD, "CrossOrder", key).strip().splitlines()[-1])
    from_python = idempotent_job.record("CrossOrder", int(key))
    assert list(from_ruby) == list(from_python)
    for name, value in from_python.items():
        if isinstance(value, float):
            assert from_ruby[name] == pytest.approx(value, abs=1e-3), name
        else:
            assert from_ruby[name] == value, name
    assert from_python["stored_job"] is False and from_python["job_classes"] == ["CrossOrder"]


def rust(job_type: str, key: str, payload, seconds: float = 0) -> subprocess.Popen:
    """The Rust door's example (crates/rust/examples/perform_once.rs, built by `cargo test`)."""
    binary = ROOT / "target" / "debug" / "examples" / "perform_once"
    if not binary.exists():
        pytest.fail(
            "the Rust door's example is not built: run `cargo build -p idempotent_job_rust --examples`"
        )
    return subprocess.Popen(
        [str(binary), job_type, key, str(seconds), json.dumps(payload)],
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        text=True,
    )


def test_rust_first_then_python_then_ruby_on_one_record(scenario):
    # A Rust service claims the operation; copies delivered to Python and Ruby meanwhile
    # meet its live claim, and after its completion find it completed: decided once.
    key = str(abs(hash(scenario)) % 10**12)
    first = rust("CrossOrder", key, RUBY_PAYLOAD, seconds=3)
    eventually(lambda: idempotent_job.record("CrossOrder", int(key)), "the Rust claim", 60, 0.05)
    assert python(scenario, key).decision == "in_progress"
    assert ruby("CrossOrder", key, RUBY_PAYLOAD)["decision"] == "in_progress"
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and json.loads(out)["decision"] == "ran"
    assert python(scenario, key).decision == "completed"
    assert ruby("CrossOrder", key, RUBY_PAYLOAD) == {"decision": "completed", "value": f"rust ran {key}"}
    record = idempotent_job.record("CrossOrder", int(key))
    assert record["attempts"] == 1 and record["mismatches"] == 0 and record["status"] == "completed"
    assert effects(scenario) == 0


def test_wide_numbers_are_one_operation_across_languages(scenario):
    # Issue 29 item 4: Ruby claims an operation keyed 2**70-and-more whose payload holds
    # 2**64, the float 1e20 and -(2**100); Python delivers it with 10**20 (an int): one
    # record, no mismatch (the core writes every number: integers of any width as their
    # digits, an integral float as the integer it equals).
    key = 2**70 + abs(hash(scenario)) % 10**6
    assert ruby("CrossWide", str(key), [2**64, 1e20, {"w": -(2**100)}])["decision"] == "ran"
    outcome = idempotent_job.perform_once(
        "CrossWide", key, lambda c: None, payload=[2**64, 10**20, {"w": -(2**100)}], on_mismatch="raise"
    )
    assert outcome.decision == "completed"
    record = idempotent_job.record("CrossWide", key)
    assert record["operation_key"] == str(key)
    assert record["mismatches"] == 0 and record["attempts"] == 1


def test_a_different_payload_is_a_mismatch_across_languages(scenario):
    key = str(abs(hash(scenario)) % 10**12)
    assert ruby("CrossOrder", key, RUBY_PAYLOAD)["decision"] == "ran"
    idempotent_job.perform_once("CrossOrder", int(key), lambda c: None, payload=[42, 2.5, {"a": "x", "b": 1}])
    assert idempotent_job.record("CrossOrder", int(key))["mismatches"] == 1


KEYS_RUBY = """
require "idempotent_job"
require "json"
values, composites, payloads = JSON.parse(ARGV[0])
keys = values.map { |v| IdempotentJob::Key.value_key(v, "CrossKey") }
composite = composites.map do |parts|
  IdempotentJob::Key.new("CrossKey", (0...parts.size).to_a).operation_key(parts)
end
digests = payloads.map { |p| IdempotentJob::ArgsDigest.of(p) }
puts JSON.generate([keys, composite, digests])
"""

KEY_VALUES = [
    42,
    0,
    -7,
    2**63 - 1,
    "ord-1",
    "42",
    "[not json",
    '{"id":7}',
    "café",
    [1, "a", 2.0],
    {"b": [1], "a": "x"},
    2**64,
    -(2**80),
    {"n": 2**70, "f": 1e20},
]
COMPOSITES = [[42, "dhl"], ["a:b", "c"], ["a", "b:c"], [{"z": 1, "a": 2.0}, 7, "x"], [2**64, "x"]]
PAYLOADS = [
    [],
    [42, 2.0, {"b": 1, "a": "x"}],
    ["é", "\u2028/\t", 1.5e-7, 0.0001, 123456.789, None, True, False],
    [{"nested": [1, {"z": 0.1, "a": -0.5}]}, 1e20, 12345678901234.5],
    [2**64, -(2**100), 10**20, 1e23, 1.7976931348623157e308, -0.0, {"w": [2**70]}],
]


def test_keys_and_digests_are_equal_in_ruby_and_python():
    if not list((ROOT / "lib" / "idempotent_job").glob("*.so")):
        pytest.fail("the Ruby extension is not built: run `rake compile` first")
    done = subprocess.run(
        ["ruby", "-Ilib", "-e", KEYS_RUBY, json.dumps([KEY_VALUES, COMPOSITES, PAYLOADS])],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ruby_keys, ruby_composites, ruby_digests = json.loads(done.stdout.strip().splitlines()[-1])
    from idempotent_job._native import Store, args_digest

    assert [idempotent_job.operation_key(v, "CrossKey") for v in KEY_VALUES] == ruby_keys
    assert [Store.operation_key("CrossKey", parts, True) for parts in COMPOSITES] == ruby_composites
    assert [args_digest(p) for p in PAYLOADS] == ruby_digests
