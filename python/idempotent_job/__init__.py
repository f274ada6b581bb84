"""idempotent_job for Python: durable idempotency records in PostgreSQL, over the same
Rust core and the same table as the Ruby gem.

A background job, a Celery task or any consumer of an at-least-once queue runs its
effect at most once per *operation key*: the first delivery takes a *claim* with a
*lease*; a duplicate finds the operation completed, in progress or held and does not
run. See python/README.md.

    import idempotent_job
    idempotent_job.configure(database_url="postgres://…", lease=300)
    idempotent_job.migrate()
    outcome = idempotent_job.perform_once("ChargeOrder", order_id, lambda claim: charge(order_id))
"""

from __future__ import annotations

import atexit
import datetime
import decimal
import fractions
import inspect
import json
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import _native, _tracing, errors
from ._native import Claim, Outcome, Store
from .errors import (
    ConfigurationError,
    ConnectionError,
    DatabaseError,
    IdempotentJobError,
    LockTimeoutError,
    LookupError,
    LostClaimError,
    MigrationError,
    OperationKeyError,
    PayloadMismatchError,
    TimeoutError,
    UnreadableRecordError,
)

#: The package's version (the Cargo workspace's, compiled into the native module).
__version__: str = _native.__version__

__all__ = [
    "__version__",
    "configure",
    "migrate",
    "perform_once",
    "held",
    "resolve",
    "on_rerun",
    "Rerun",
    "purge",
    "record",
    "repeats",
    "repeats_report",
    "RepeatsReport",
    "operation_key",
    "Claim",
    "Outcome",
    "errors",
    "IdempotentJobError",
    "ConfigurationError",
    "UnreadableRecordError",
    "ConnectionError",
    "DatabaseError",
    "LostClaimError",
    "MigrationError",
    "OperationKeyError",
    "LookupError",
    "PayloadMismatchError",
    "LockTimeoutError",
    "TimeoutError",
]

logger = logging.getLogger("idempotent_job")

_store: Store | None = None
_lock = threading.Lock()


def configure(**settings: Any) -> None:
    """Sets up the database and the job defaults for this process (and the processes it
    forks: Celery's prefork pool children each build their own pool from these settings).

    Takes the same settings as the Ruby gem's ``IdempotentJob.configure``: ``database_url``
    (default ``IDEMPOTENT_JOB_DATABASE_URL``, then ``DATABASE_URL``), ``pool_size``,
    ``connect_timeout``, ``checkout_timeout``, ``deadline``, ``statement_timeout`` (seconds),
    ``application_name``, ``schema``, ``host``, ``port``, ``dbname``, ``user``, ``password``,
    ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, ``prepared_statements``,
    ``asynchronous_completion``, ``max_result_bytes`` (bytes of JSON a stored result may take,
    default 65,536); and the job defaults ``lease`` (seconds, default 300),
    ``on_stale`` ("reclaim", "hold" or "skip"), ``on_mismatch`` ("log" or "raise"),
    ``heartbeat`` (bool), ``max_run`` (seconds), ``defer_margin`` (seconds), ``retention``
    (seconds, for :func:`purge`). Connects lazily, on first use.

    Raises:
        ConfigurationError: naming an unknown setting or a bad value; None too, where the
            Ruby gem's nil is refused (a job default: "lease must be set (its default is
            300), got None"; a connection setting that must have a value), in the core's
            words. ``database_url=None`` reads the environment.
    """
    global _store
    store = Store(_settings_json(settings))
    with _lock:
        _store = store


def _settings_json(settings: dict[str, Any]) -> str:
    """``settings`` as the JSON object the core checks; ConfigurationError naming the
    setting whose value no JSON carries (NaN, an infinity, bytes, a set, any object),
    its value hidden for ``password`` and ``database_url`` (they may hold a secret)."""
    settings = {name: _seconds(value) for name, value in settings.items()}
    for name, value in settings.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            shown = "[REDACTED]" if name in ("password", "database_url") else repr(value)[:100]
            raise ConfigurationError(
                f"{name} must be a number, a string, a boolean or None, got {shown} "
                f"({type(value).__name__}); nothing was changed"
            ) from None
    return json.dumps(settings)


def _seconds(value: Any) -> Any:
    """A number given as a ``Decimal`` or ``Fraction`` as a float, a ``timedelta`` as its
    ``total_seconds()`` (as the native options take them: ``timedelta(60)`` is 60 days);
    any other value as it is. A Decimal ``sNaN`` is NaN and a Fraction beyond the float
    range an infinity (refused by the core's rule, never float()'s ValueError or
    OverflowError)."""
    if isinstance(value, decimal.Decimal) and value.is_nan():
        return math.nan
    if isinstance(value, (decimal.Decimal, fractions.Fraction)):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


def _current() -> Store:
    global _store
    with _lock:
        if _store is None:
            _store = Store("{}")
        return _store


def migrate() -> list[str]:
    """Applies the pending migrations (the same as the Ruby gem's ``IdempotentJob.migrate!``,
    to the same table). Returns the names of the migrations applied now.

    Raises:
        MigrationError, ConnectionError, TimeoutError.
    """
    return _current().migrate()


def _job_type(job_type: Any) -> str:
    """``job_type`` as text the core takes (a str subclass by its value, never its own
    ``__str__``); ConfigurationError naming it (escaped) when it is not valid UTF-8 (a
    lone surrogate, as ``surrogateescape`` decoding leaves), or None, or not a str at
    all (an int, bytes, an object: ``str`` would make a job type of its text, ``"42"``,
    ``"b'x'"`` or an address, silently another record)."""
    if job_type is None:
        raise ConfigurationError("the job type must be given (a str), got None; nothing was run or recorded")
    if not isinstance(job_type, str):
        raise ConfigurationError(
            f"the job type must be a str, got {type(job_type).__name__} {_shown(job_type)}; "
            "nothing was run or recorded"
        )
    text = str.__str__(job_type)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"the job type {text!a} is not valid UTF-8: job types are text; nothing was run or recorded"
        ) from None
    return text


def _shown(value: Any) -> str:
    """``value``'s ``repr`` cut to 100 characters (its type's name when it has none)."""
    try:
        text = repr(value)
    except Exception:  # an int too long to write, a raising __repr__
        return f"<{type(value).__name__}>"
    return text if len(text) <= 100 else text[:100] + "..."


def operation_key(value: Any, job_type: str = "operation") -> str:
    """The operation key's text for ``value`` as the record stores it (the same text the
    Ruby gem makes): a str as it is, an int in decimal, a non-empty dict or list as its
    canonical JSON; a list/tuple passed as ``value`` with ``composite`` keys is not meant
    here (see :class:`idempotent_job.celery.IdempotentTask`).

    Raises:
        OperationKeyError: for None, a bool, a float, an empty value, a NUL character, or
            a key over 2,000 bytes together with ``job_type``.
        ConfigurationError: for a job type that is None or not valid UTF-8.
    """
    return Store.operation_key(_job_type(job_type), value)


def perform_once(
    job_type: str,
    key: Any,
    fn: Callable[[Claim], Any],
    lease: float | None = None,
    payload: Any = None,
    store_result: bool = False,
    wait: float | None = None,
    *,
    on_stale: str | None = None,
    on_mismatch: str | None = None,
    lookup: Callable[[str], str] | None = None,
    heartbeat: bool | None = None,
    max_run: float | None = None,
    max_takeovers: int | None = None,
    id: str | None = None,  # noqa: A002 - the Ruby gem's name
    deferrals: int = 0,
    job_class: str | None = None,
    queue: str | None = None,
    facts: dict | None = None,
    **unknown: Any,
) -> Outcome:
    """Runs ``fn(claim)`` at most once for the operation ``(job_type, key)``.

    Args:
        job_type: the record's job type (or scope); a Ruby job with the same job type and
            key names the same record.
        key: the operation key: a str, an int, or a non-empty dict/list of JSON values.
        fn: the body; gets the :class:`Claim` (``claim.operation_key`` is the reference
            to pass downstream). Runs with the claim held; its return value is
            ``outcome.value``.
        lease: seconds the claim stays live without a renewal (default: configure's).
        payload: the operation's arguments (any JSON value); a later delivery with a
            different payload is a payload mismatch (logged, or refused under
            ``on_mismatch="raise"``).
        store_result: store ``fn``'s return value (a JSON value) with the completion, in
            the same statement, so a repeat gets it as ``outcome.value`` with
            ``outcome.replayed`` True (a value over ``max_result_bytes`` or not JSON is not
            stored; the completion stands).
        wait: seconds (0 or more; a ``timedelta``, ``Decimal`` or ``Fraction`` too) to wait
            for a running claim's completion when this call meets one: the core listens for
            it (polls behind PgBouncer) without holding a pooled connection, then replays the
            stored value; if the holder released (its body raised) this call may claim and
            run; "in_progress" when the wait ends first. ``fn`` never runs while a live lease
            holds. None (default): no wait.
        on_stale, on_mismatch, lookup, heartbeat, max_run: as the Ruby gem's options;
            ``lookup(operation_key)`` is asked after a takeover of a stale claim and answers
            "done", "not_done" or "unknown".
        max_takeovers: the reclaim budget: after this many stale takeovers of the
            operation, the next stale claim (after ``lookup``, if it does not know) is held
            for a person instead of reclaimed; the record's ``last_error`` says why.
            None (default): no budget.
        id: this delivery's id (stored as the record's last claiming jid); default a
            fresh UUID.
        deferrals: how many times this delivery already met a live claim (for
            ``retry_after``'s back-off).
        job_class, queue: what a ``resolve`` rerun sends, stored on the record (with the
            payload) when this delivery takes a stale claim over; ``job_class`` is also
            listed in the repeats report.
        facts: a dict of JSON values about this delivery, kept for the repeats report.

    Returns:
        An :class:`Outcome`: ``decision`` is "ran", "completed", "held", "given_up",
        "in_progress" (then ``retry_after`` says in how many seconds to come back) or
        "refused" (a released or stale claim with a different payload under
        ``on_mismatch="raise"``). Decisions are logged on the ``idempotent_job`` logger.

    Raises:
        OperationKeyError: for a bad key. ConfigurationError: for a bad option value
            (checked by the core's options table) or an unknown keyword (naming the job,
            the call, the keyword and the nearest known one), a job type that is None or not
            valid UTF-8, or an ``id``/``job_class``/``queue`` that is not a str, ``deferrals``
            not a whole number from 0 to 2**32 - 1, ``facts`` not a dict (naming the job;
            nothing is claimed).
        PayloadMismatchError: under ``on_mismatch="raise"``. LookupError.
        ConnectionError, TimeoutError, DatabaseError: the body did not run.
        Whatever ``fn`` raised: its claim was released first, so a retry runs it again
            (SystemExit and KeyboardInterrupt keep the claim until its lease ends: the
            process is going away and the effect may have happened).
    """
    job_type = _job_type(job_type)
    if unknown:
        _native.not_taken(job_type, "perform_once", sorted(unknown)[0], _PERFORM_ONCE_OPTIONS)
    if not callable(fn):
        raise ConfigurationError(f"{job_type}: perform_once needs a callable body, got {type(fn).__name__}")
    deferrals = _check_delivery(
        job_type, id=id, job_class=job_class, queue=queue, deferrals=deferrals, facts=facts
    )
    key_text = Store.operation_key(job_type, key)
    store = _current()
    options = {
        "lease": lease,
        "on_stale": on_stale,
        "on_mismatch": on_mismatch,
        "lookup": lookup,
        "heartbeat": heartbeat,
        "max_run": max_run,
        "store_result": store_result,
        "max_takeovers": max_takeovers,
    }
    if wait is not None:
        # The core's rule and words (0 to ten years), before anything is claimed: an int
        # beyond the float range, NaN or a bool is refused as such, never an OverflowError.
        wait = _native.check_wait(job_type, _seconds(wait))
    return _tracing.perform(
        "plain",
        job_type,
        key_text,
        lambda: store.perform_once(
            store.protocol(job_type, options, None),
            job_type,
            key_text,
            fn,
            [] if payload is None else payload,
            id or str(uuid.uuid4()),
            deferrals,
            job_class,
            queue,
            facts,
            lookup,
            wait,
        ),
    )


def _check_delivery(job_type: str, *, deferrals: Any, facts: Any, **texts: Any) -> int:
    """ConfigurationError naming the job for a delivery argument of the wrong kind, before
    anything is claimed (the native layer would raise a bare TypeError or OverflowError);
    the deferral count as a plain int otherwise."""

    def refuse(what: str, value: Any) -> ConfigurationError:
        return ConfigurationError(
            f"{job_type}: perform_once's {what}, got {value!r:.100}; "
            "the job was not run and nothing was recorded"
        )

    for name, value in texts.items():
        if value is not None and not isinstance(value, str):
            raise refuse(f"{name} must be a str (or None)", value)
    # The core's count rule and words (the Ruby gem's for a payload's idempotency_deferrals
    # too), read from the int's value; a str is no count here (the doors read header text).
    if isinstance(deferrals, str):
        raise ConfigurationError(
            _native.deferrals_refusal(job_type, "perform_once's deferrals", repr(deferrals))
        )
    count = _native.delivery_count(job_type, "perform_once's deferrals", deferrals)
    if facts is not None and not isinstance(facts, dict):
        raise refuse("facts must be a dict (or None)", facts)
    return count


#: The keywords perform_once takes after the job type, the key and the body.
_PERFORM_ONCE_OPTIONS = [
    p.name for p in list(inspect.signature(perform_once).parameters.values())[3:] if p.kind != p.VAR_KEYWORD
]


def held(job_type: str | None = None, limit: int = _native.DEFAULT_HELD_LIMIT) -> list[tuple[str, str]]:
    """The held operations (a stale claim under ``on_stale="hold"``), oldest first, as
    ``(job_type, operation_key)`` pairs; only ``job_type``'s when given, at most ``limit``
    (1 or more; beyond 64 bits, no limit). Read-only. ConfigurationError for a job type that
    is not valid UTF-8 or a limit below 1 or not an int (``True``, ``1.5``, ``"5"``). Only the
    keys are read: a record the core cannot read (a time edited to ``'infinity'``) is listed,
    and :func:`record` of it raises ``UnreadableRecordError`` naming it and its column (the
    Ruby gem's ``held``, which returns records, raises that error; its web page marks the row)."""
    return _current().held(None if job_type is None else _job_type(job_type), _whole(limit))


@dataclass(frozen=True)
class Rerun:
    """The stored delivery of an operation resolved with ``resolve(..., as_="rerun")``:
    what its last claim stored, for a sender registered with :func:`on_rerun` to send
    through its queue again. ``args`` is the payload (decoded JSON; None when none was
    stored), ``first_facts`` the first claim's facts (a dict, or None)."""

    job_type: str
    operation_key: str
    job_class: str | None
    queue: str | None
    args: Any
    first_facts: dict | None


_senders: list[Callable[[Rerun], Any]] = []
_senders_lock = threading.Lock()


def on_rerun(sender: Callable[[Rerun], Any]) -> Callable[[Rerun], Any]:
    """Registers ``sender(rerun)``, asked by :func:`resolve` with ``as_="rerun"`` to send
    the released operation's stored delivery (a :class:`Rerun`) through its queue again;
    it returns True when it sent it, False (or None) when the delivery is not its kind.
    Senders are asked latest first; the first that sends wins. The Celery door registers
    one when ``idempotent_job.celery`` is imported (it sends the task by name);
    ``idempotent_job.sqs.resender(client)`` makes one for an SQS queue; a plain
    :func:`perform_once` caller registers its own. Usable as a decorator; returns
    ``sender``."""
    if not callable(sender):
        raise ConfigurationError(f"on_rerun needs a callable sender, got {type(sender).__name__}")
    with _senders_lock:
        _senders.append(sender)
    return sender


def resolve(job_type: str, key: Any, as_: str = "done") -> bool:
    """Settles a held or given-up operation: ``as_="done"`` marks it completed (the effect
    is known to have happened); ``as_="rerun"`` releases it and re-sends its stored
    delivery (the last claim's job class, queue and payload) through the first sender
    registered with :func:`on_rerun` that takes it, latest first; that delivery claims the
    operation as a retry and runs once. When no sender takes it, a WARNING on the
    ``idempotent_job`` logger says the operation was only released (its next delivery or
    :func:`perform_once` call runs it). ``key`` is the operation key as given to
    :func:`perform_once` (or its stored text). Returns False when the operation is not
    held or given up. One statement: the release and the stored delivery it answers.

    Raises:
        ConfigurationError: for another ``as_``, a job type that is not valid UTF-8, or a
            rerun of a record that holds no stored job (held without a takeover, which
            is what stores it; the record stays as it was).
        Whatever a sender raised, after the release (send the delivery again by hand).
    """
    job_type = _job_type(job_type)
    key_text = Store.operation_key(job_type, key)
    stored = _current().resolve(job_type, key_text, as_)
    if stored is None:
        return False
    if as_ == "rerun":
        _rerun(
            Rerun(
                job_type,
                key_text,
                stored["job_class"],
                stored["queue"],
                None if stored["args_json"] is None else json.loads(stored["args_json"]),
                None if stored["first_facts_json"] is None else json.loads(stored["first_facts_json"]),
            )
        )
    return True


def _rerun(rerun: Rerun) -> None:
    name = f"{rerun.job_type} operation {rerun.operation_key!r}"
    with _senders_lock:
        senders = list(reversed(_senders))
    for sender in senders:
        if sender(rerun):
            logger.warning("idempotent_job: %s resolved for a rerun: re-sent by %s", name, _name_of(sender))
            return
    logger.warning(
        "idempotent_job: %s resolved for a rerun: released only; no sender registered with "
        "idempotent_job.on_rerun re-sends %r, so its next delivery (or perform_once call) runs it",
        name,
        rerun.job_class,
    )


def _name_of(sender: Callable) -> str:
    return getattr(sender, "__qualname__", None) or type(sender).__name__


def purge(older_than: float | None = None, batch: int = _native.DEFAULT_PURGE_BATCH) -> int:
    """Deletes finished records (completed or given up) older than ``older_than`` seconds
    (a number, a ``timedelta``, ``Decimal`` or ``Fraction``; default: the ``retention``
    setting, 30 days), in batches of ``batch``. Returns how
    many were deleted. Held and claimed records are kept. ConfigurationError (the core's
    rule) for an ``older_than`` that is negative, NaN or infinite (``10**400`` too) or a
    ``batch`` below 1 or not an int (``True``, ``1.5``, ``"5"``)."""
    older_than = _seconds(older_than)
    if older_than is not None and isinstance(older_than, int) and not isinstance(older_than, bool):
        try:
            older_than = float(int.__index__(older_than))
        except OverflowError:  # beyond the float range: refused by the core as infinite
            older_than = math.inf if older_than > 0 else -math.inf
    return _current().purge(older_than, _whole(batch))


#: The range of the core's limits and batch sizes (PostgreSQL's bigint).
_I64 = (-(2**63), 2**63 - 1)


def _whole(value: Any) -> Any:
    """An int beyond the core's 64-bit range clamped to it (a huge limit is no limit, a
    hugely negative one is refused by the core as negative), never pyo3's OverflowError;
    any other value as given."""
    if isinstance(value, int) and not isinstance(value, bool):
        return min(max(int.__index__(value), _I64[0]), _I64[1])
    return value


def record(job_type: str, key: Any) -> dict | None:
    """The idempotency record of ``(job_type, key)`` as a dict of the core's record fields
    (the Ruby ``IdempotentJob::Record``'s members: times in epoch seconds, ``args`` and
    ``result`` decoded JSON, ``job_classes`` a list, ``stored_job`` whether a rerun has a job
    to re-send), or None when the operation was never claimed. Read-only.
    ConfigurationError for a job type that is not valid UTF-8."""
    job_type = _job_type(job_type)
    return _current().find(job_type, Store.operation_key(job_type, key))


def _epoch(value: Any, name: str) -> float:
    """``value`` (a timezone-aware datetime, or int or float epoch seconds) as epoch
    seconds in the core's range for a report time (years 1 to 9999: NaN, an infinity or
    ``10**400`` is refused in its words, never an OverflowError); ConfigurationError
    naming ``name`` otherwise."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ConfigurationError(
                f"repeats: {name} must be a timezone-aware datetime or epoch seconds, got {_shown(value)}"
            )
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _native.check_time(name, value)
    raise ConfigurationError(f"repeats: {name} must be a datetime or epoch seconds, got {_shown(value)}")


def repeats(
    since: Any = None,
    job_type: str | None = None,
    restarts: Any = (),
    restart_window: float = _native.DEFAULT_RESTART_WINDOW,
) -> list[dict]:
    """Operations delivered more than once since ``since``, each repeat classified from the
    facts recorded with it, by the core's rules (the Ruby gem's ``IdempotentJob.repeats``,
    same parameters and causes; docs/repeats.md). Reads ``idempotent_job_records``;
    writes nothing but this process's queued repeat bookkeeping.

    Args:
        since: a timezone-aware ``datetime`` or epoch seconds; default 24 hours ago.
        job_type: only this job type (None: every one).
        restarts: deploy/restart times (datetimes or epoch seconds) a redelivery is
            matched to.
        restart_window: seconds (a ``timedelta``, ``Decimal`` or ``Fraction`` too) after a
            restart within which a redelivery is matched to it.

    Returns:
        One dict per operation, oldest first claim first per job type: ``job_type``,
        ``operation_key``, ``status`` (str), ``attempts``, ``takeovers``, ``duplicates``,
        ``mismatches``, ``replays`` (int), ``first_claimed_at``, ``completed_at`` (epoch
        seconds, or None), ``producers``, ``job_classes`` (lists of str) and ``repeats``:
        a list (arrival order) of dicts with ``cause`` ("concurrent_copy",
        "queue_retry", "redelivery", "re_enqueue_same_producer",
        "re_enqueue_other_producer", "re_enqueue", "unknown"), ``at`` (epoch seconds),
        ``id`` (the delivery id), ``after_claim``, ``after_enqueue`` (seconds, or None),
        ``retry_count``, ``producer``, ``first_producer``, ``live_claim``,
        ``deferred_return`` (a deferred copy back: not a new repeat), ``restart`` (the
        matched restart, epoch seconds, or None) and ``decision``.

    Raises:
        ConfigurationError: for a ``since``/``restarts`` that is not a time, a negative
        ``restart_window`` or a job type that is not valid UTF-8. ConnectionError,
        DatabaseError: as every call.
    """
    return json.loads(_repeats_json(since, job_type, restarts, restart_window))


def _repeats_json(since: Any, job_type: str | None, restarts: Any, restart_window: float) -> str:
    since_s = time.time() - _native.DEFAULT_REPEATS_SINCE if since is None else _epoch(since, "since")
    times = [_epoch(t, "restarts") for t in restarts]
    job = None if job_type is None else _job_type(job_type)
    # Checked by the core: an int, a float (a timedelta, Decimal or Fraction as one) or
    # the core's refusal, never float()'s reading of True, None or "90".
    return _current().repeats(since_s, job, times, _seconds(restart_window))


@dataclass(frozen=True)
class RepeatsReport:
    """The repeats report as the Ruby gem's ``rake idempotent_job:repeats`` prints it: the
    core computes the summary, the text and the CSV for both (docs/repeats.md).

    Attributes:
        operations: :func:`repeats`'s dicts, each with ``notes`` (list of str: several
            producers or job classes, different payloads, stale claims taken over, held).
        summary: per job type (in the order they first appear), a dict of counts:
            ``operations``, ``repeats`` (deferred copies back left out), one per cause,
            ``near_restart``, ``deferred_returns``, ``several_producers``, ``takeovers``,
            ``held``, ``mismatched``, ``replays``.
        producer_pairs: per ``(job_type, producer, producer)``, the operations both
            producers enqueued, most first.
        lines: the report as text: one line per operation, then per job type, then per
            pair of producers.
        csv: one CSV row per repeat (header row first); text cells that start like a
            spreadsheet formula get a leading single quote.
    """

    operations: list[dict[str, Any]]
    summary: dict[str, dict[str, int]]
    producer_pairs: dict[tuple[str, str, str], int]
    lines: list[str]
    csv: str

    @classmethod
    def of(cls, operations: list[dict[str, Any]]) -> RepeatsReport:
        """The report of ``operations`` (dicts of :func:`repeats`'s shape; each gets its
        ``notes``). Pure: reads and writes nothing. ConfigurationError for an operation
        the core cannot read (a missing ``job_type``, an unknown ``cause``…)."""
        printed = json.loads(_native.repeats_report(json.dumps(operations)))
        # One list of notes per operation (zip's strict= would need Python 3.10).
        if len(printed["notes"]) != len(operations):
            raise ConfigurationError(
                f"repeats report: the core printed notes for {len(printed['notes'])} operations, "
                f"given {len(operations)}"
            )
        operations = [{**op, "notes": notes} for op, notes in zip(operations, printed["notes"])]
        return cls(
            operations=operations,
            summary={job_type: dict(counts) for job_type, counts in printed["summary"]},
            producer_pairs={(t, a, b): n for t, a, b, n in printed["producer_pairs"]},
            lines=printed["lines"],
            csv=printed["csv"],
        )


def repeats_report(
    since: Any = None,
    job_type: str | None = None,
    restarts: Any = (),
    restart_window: float = _native.DEFAULT_RESTART_WINDOW,
) -> RepeatsReport:
    """The repeats report of the operations :func:`repeats` reads (same parameters, same
    errors): a :class:`RepeatsReport` with the summary per job type, the pairs of
    producers, the text lines and the CSV, as the Ruby gem's ``rake
    idempotent_job:repeats`` and ``IdempotentJob::Repeats.report`` print them. Reads
    ``idempotent_job_records``; writes nothing but this process's queued repeat
    bookkeeping. ``print("\\n".join(report.lines))`` prints the report as the rake task
    does; ``report.csv`` is what its ``CSV=path`` writes."""
    return RepeatsReport.of(json.loads(_repeats_json(since, job_type, restarts, restart_window)))


@atexit.register
def _settle() -> None:
    # Duplicate counts are written in the background; write what is queued at exit.
    store = _store
    if store is not None:
        try:
            store.settle()
        except IdempotentJobError as exc:  # pragma: no cover - only logged at exit
            logger.warning("idempotent_job: could not write the repeat bookkeeping at exit: %s", exc)
