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
    "set": set,
    "frozenset": frozenset,
    "bytes": bytes.fromhex,
    "bytearray": bytearray.fromhex,
    "lone_surrogate": lambda hexed: chr(int(hexed, 16)),
    "lone_surrogate_key": lambda hexed: {chr(int(hexed, 16)): 1},
    "map_key": lambda kind: {MAP_KEYS[kind]: "v"},
    "colliding_keys": lambda kind: {1: "a", "1": "b"},
}
# The map keys of the table's `map_key` cases, as Python writes them (no Symbol).
MAP_KEYS = {"integer": 1, "float": 1.5, "list": (1, 2), "null": None, "boolean": True}


def native(case: dict) -> bool:
    """Whether Python has the case's value (a Ruby binary String or Symbol is not a
    Python value)."""
    if "json" in case:
        return True
    ((name, argument),) = case["make"].items()
    if name == "map_key":
        return argument in MAP_KEYS
    if name == "colliding_keys":
        return argument == "integer"
    return name in MAKERS


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
