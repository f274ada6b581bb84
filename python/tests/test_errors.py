"""idempotent_job.errors against the core's one error table: every class the core names
exists in the package, carries the table's attributes and says ``retryable`` as the table
does, both when Python code raises it and when the native layer builds it (which also says
``sends_back`` as the table does)."""

from __future__ import annotations

import json

import pytest

import idempotent_job
from idempotent_job import _native, errors

TABLE = json.loads(_native.error_table_json())


def _class(name: str) -> type:
    return errors.IdempotentJobError if name == "Error" else getattr(errors, name)


def test_the_classes_are_the_cores_table():
    names = {"IdempotentJobError" if e["name"] == "Error" else e["name"] for e in TABLE}
    assert set(errors.__all__) == names
    for name in names:  # the package exports each as errors.py defines it
        assert name in idempotent_job.__all__ and getattr(idempotent_job, name) is getattr(errors, name)


@pytest.mark.parametrize("entry", TABLE, ids=[e["name"] for e in TABLE])
def test_each_class_has_the_tables_attributes_and_retryable_flag(entry):
    cls = _class(entry["name"])
    assert issubclass(cls, errors.IdempotentJobError)
    assert cls("raised by Python").retryable is entry["always_retryable"]
    assert cls.always_retryable is entry["always_retryable"]

    built = _native.error_example(entry["name"])
    assert type(built) is cls
    if entry["always_retryable"]:
        assert built.retryable is True
    assert built.sends_back is entry["sends_back"]
    for attribute in entry["attributes"]:
        if attribute in ("job_class", "declaration"):  # the key's own: set by the host
            assert attribute in cls.__doc__
        else:
            assert isinstance(getattr(built, attribute), str) and getattr(built, attribute)


def test_a_record_error_names_its_record_in_both_languages_alike():
    for name in ("LostClaimError", "PayloadMismatchError", "LookupError"):
        built = _native.error_example(name)
        assert (built.job_type, built.operation_key) == ("ExampleJob", "order-1")
