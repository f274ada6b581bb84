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
ALL_ATTRIBUTES = {a for entry in TABLE for a in entry["attributes"]}


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
    raised = cls("raised by Python")
    for attribute in entry["attributes"]:  # every class carries the table's attributes...
        assert hasattr(raised, attribute) and attribute in cls.__doc__, attribute
        if attribute not in entry["host_attributes"]:  # ...the core's set by the native layer
            assert isinstance(getattr(built, attribute), str) and getattr(built, attribute)
    for attribute in ALL_ATTRIBUTES - set(entry["attributes"]):  # ...and no other
        assert not hasattr(raised, attribute) and not hasattr(built, attribute), attribute
        with pytest.raises(TypeError):
            cls("raised by Python", **{attribute: "x"})


def test_a_record_error_names_its_record_in_both_languages_alike():
    for name in ("LostClaimError", "PayloadMismatchError", "LookupError"):
        built = _native.error_example(name)
        assert (built.job_type, built.operation_key) == ("ExampleJob", "order-1")


def test_an_operation_key_error_names_its_job_as_the_table_says():
    entry = next(e for e in TABLE if e["name"] == "OperationKeyError")
    assert set(entry["host_attributes"]) == {"job_type", "job_class", "declaration"}
    with pytest.raises(errors.OperationKeyError) as caught:
        idempotent_job.operation_key(None, "PyKeyJob")
    assert (caught.value.job_type, caught.value.job_class, caught.value.declaration) == (
        "PyKeyJob",
        "PyKeyJob",
        None,
    )
    assert str(caught.value) == _native.key_refusal("PyKeyJob", "operation key: the value is None", "job")
