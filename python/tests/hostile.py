"""The shared table of hostile values (conformance/hostile.json, issue 29): its cases and
each case's value built in Python, for the tests of every Python door."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "conformance" / "hostile.json").read_text())
CASES = TABLE["cases"]
BY_NAME = {case["name"]: case for case in CASES}
NAMES = [case["name"] for case in CASES]

FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def nested(levels: int):
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


MAKERS = {
    "nest": nested,
    "string_bytes": lambda size: "x" * size,
    # Bytes that are not UTF-8 reach Python code as lone surrogates (surrogateescape).
    "bytes_hex": lambda hexed: bytes.fromhex(hexed).decode("utf-8", "surrogateescape"),
    "float": FLOATS.__getitem__,
    # Built by arithmetic: int("9" * 5000) is refused by Python's int_max_str_digits.
    "integer_digits": lambda digits: 10**digits - 1,
    "decimal": Decimal,
    "object": lambda _: object(),
}


def value(case: dict):
    """The case's value, as the table's `about` says."""
    if "json" in case:
        return json.loads(case["json"])
    ((name, argument),) = case["make"].items()
    return MAKERS[name](argument)


def digest(value) -> str:
    """The core's payload digest of a value (equal digests: equal canonical JSON)."""
    from idempotent_job._native import args_digest

    return args_digest(value)
