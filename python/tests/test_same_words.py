"""Issue 30: the refusals both languages raise are the core's, rule and words: the Ruby
gem (run by `ruby -Ilib` from this checkout, with its compiled extension) and this
package refuse the same input with the same message, the host's notation of the value
and each door's name for what it refuses aside. Each case fails when one language words
it itself again."""

from __future__ import annotations

import json
import os

import pytest
from test_cross_language import ruby_script

import idempotent_job
from idempotent_job import _native, errors
from idempotent_job.sqs import Message, _Door

RUBY = r"""
require "idempotent_job"
require "json"
url = ENV.fetch("DATABASE_URL")
IdempotentJob.configure(database_url: url)
SAID = {}
def refused(name)
  yield
  SAID[name] = nil
rescue IdempotentJob::Error => e
  SAID[name] = [e.class.name.split("::").last, e.message]
end
nested = ->(depth) { (1..depth).reduce(1) { |inner, _| [inner] } }
refused("resolve") { IdempotentJob.resolve("SameWords", "1", as: 1) }
refused("resolve_name") { IdempotentJob.resolve("SameWords", "1", as: :maybe) }
refused("unset_lease") { IdempotentJob.configure(lease: nil) }
refused("unset_on_stale") { IdempotentJob.configure(on_stale: nil) }
refused("unset_checkout_timeout") { IdempotentJob.configure(database_url: url, checkout_timeout: nil) }
refused("unset_application_name") { IdempotentJob.configure(database_url: url, application_name: nil) }
refused("url_connect_timeout") do
  IdempotentJob.configure(database_url: "#{url}?connect_timeout=1e30")
  IdempotentJob.record("SameWords", "1")
end
IdempotentJob.configure(database_url: url)
refused("payload") do
  IdempotentJob.perform_once("SameWords", "1", payload: nested.call(200)) { raise "ran" }
end
refused("deferrals") do
  IdempotentJob::Delivery.new(job_type: "SameWords", operation_key: "1", deferrals: -1)
end
said = SAID
said["key_refusal"] = IdempotentJob::Native.key_refusal("SameWords", "PROBLEM")
puts JSON.generate(said)
"""


@pytest.fixture(scope="module")
def ruby_said() -> dict:
    out = ruby_script(RUBY)
    return json.loads(out.strip().splitlines()[-1])


def python_said(call) -> list[str]:
    try:
        call()
    except errors.IdempotentJobError as e:
        return [type(e).__name__, str(e)]
    pytest.fail("not refused")


def nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


def test_resolve_as_is_the_cores_parse_in_both(ruby_said):
    """Ruby's Configuration.choice! said "as must be one of :done, :rerun"."""
    said = python_said(lambda: idempotent_job.resolve("SameWords", "1", as_=1))
    assert said == ruby_said["resolve"] == ["ConfigurationError", "resolve as must be done or rerun, got 1"]
    said = python_said(lambda: idempotent_job.resolve("SameWords", "1", as_="maybe"))
    assert said[1] == "resolve as must be done or rerun, got 'maybe'"
    assert ruby_said["resolve_name"][1] == "resolve as must be done or rerun, got :maybe"


@pytest.mark.parametrize(
    "name,words",
    [
        ("lease", "lease must be set (its default is 300)"),
        ("on_stale", 'on_stale must be set (its default is "reclaim")'),
        (
            "checkout_timeout",
            "checkout_timeout must be a positive number of seconds up to 315360000 (ten years)",
        ),
        ("application_name", "application_name must be a non-empty string"),
    ],
)
def test_an_unset_setting_is_refused_in_the_cores_words_and_the_hosts_notation(ruby_said, name, words):
    """Ruby worded "must be set (its default is …)" itself; Python skipped a None. Each
    language shows the unset value in its own notation (None, nil), as every other value
    (Python said JSON's "got null")."""
    url = os.environ["DATABASE_URL"]
    try:
        said = python_said(lambda: idempotent_job.configure(database_url=url, **{name: None}))
    finally:
        idempotent_job.configure(database_url=url)
    assert said == ["ConfigurationError", f"{words}, got None"]
    assert ruby_said[f"unset_{name}"] == ["ConfigurationError", f"{words}, got nil"]


def test_the_urls_connect_timeout_has_the_settings_rule_in_both(ruby_said):
    url = os.environ["DATABASE_URL"]
    try:
        said = python_said(lambda: idempotent_job.configure(database_url=f"{url}?connect_timeout=1e30"))
    finally:
        idempotent_job.configure(database_url=url)
    assert said == ruby_said["url_connect_timeout"]
    assert said[1] == (
        "database_url parameter connect_timeout must be a positive number of seconds up to "
        '315360000 (ten years), got "1e30"'
    )


def test_a_payload_json_cannot_carry_is_refused_in_the_cores_words(ruby_said):
    """Python said "the payload holds …, which JSON cannot carry"."""
    said = python_said(
        lambda: idempotent_job.perform_once(
            "SameWords", "1", lambda claim: pytest.fail("ran"), payload=nested(200)
        )
    )
    assert said == ruby_said["payload"]
    assert said[1].startswith("SameWords: the payload cannot be written as JSON")


def test_a_deferral_count_that_is_no_count_is_refused_in_the_cores_words(ruby_said):
    said = python_said(
        lambda: idempotent_job.perform_once("SameWords", "1", lambda claim: pytest.fail("ran"), deferrals=-1)
    )
    rule = (
        " must be a whole number from 0 to 4294967295, got -1; the job was not run and nothing was recorded"
    )
    assert said == ["ConfigurationError", "SameWords: perform_once's deferrals" + rule]
    assert ruby_said["deferrals"] == [
        "ConfigurationError",
        "SameWords: the delivery's deferrals (idempotency_deferrals)" + rule,
    ]
    assert _native.MAX_DEFERRALS == 4294967295


def test_the_sqs_doors_key_error_is_the_cores_refusal(ruby_said):
    """The SQS door spelled "<job>: key …: message … has no …: <problem>" itself, without
    the refusal's "the job was not run and nothing was recorded"."""
    door = _Door(print, "SameWords", "body.order_id", {})
    message = Message("m-1", "r-1", "{}", {}, {}, {})
    with pytest.raises(errors.OperationKeyError) as caught:
        door.operation_key(message)
    text = str(caught.value)
    assert text.startswith("SameWords: key 'body.order_id': message m-1 has no 'body.order_id'")
    problem = text.removeprefix("SameWords: ").split("; the job was not run")[0]
    assert ruby_said["key_refusal"].replace("PROBLEM", problem) == text
