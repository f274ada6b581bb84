"""The exceptions of idempotent_job: one base, :class:`IdempotentJobError`, and the
same subclasses as the Ruby gem (``lib/idempotent_job/errors.rb``). The native layer
raises them by name from the core's one error enum; every class, its attributes and
whether it is always retryable are checked against the core's error table
(``_native.error_table_json()``) by ``tests/test_errors.py``: a class carries the
attributes the table gives it (declared below as class attributes, None until set) and
no other.
"""

from __future__ import annotations

from typing import Any

__all__ = [
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


class IdempotentJobError(Exception):
    """Base class of every exception idempotent_job raises.

    Attributes:
        sqlstate: PostgreSQL's five-character SQLSTATE when the database sent one, else None.
        retryable: whether the same call made again later may succeed (bool).
        sends_back: whether a door sends a delivery whose claim failed with this error
            before its body ran back to its queue rather than failing it (bool; the core's
            rule: any answer of the database or an outage, not a bad key or option).

    A subclass's own attributes (the core's table: ``job_type`` and ``operation_key`` of
    the errors that name a record; ``job_type``, ``job_class`` and ``declaration`` of
    :class:`OperationKeyError`) are given as keywords; a keyword the class does not
    carry raises ``TypeError``.
    """

    #: Whether every instance of the class is retryable (the native layer may say so per error).
    always_retryable = False

    def __init__(
        self,
        message: str = "",
        *,
        sqlstate: str | None = None,
        retryable: bool | None = None,
        sends_back: bool | None = None,
        **attributes: Any,
    ) -> None:
        """Sets the attributes the class documents: ``retryable`` defaults to the class's
        ``always_retryable``, ``sends_back`` to ``retryable``; other keywords must be
        attributes of the class (else ``TypeError``)."""
        super().__init__(message)
        self.sqlstate = sqlstate
        self.retryable = self.always_retryable if retryable is None else bool(retryable)
        self.sends_back = self.retryable if sends_back is None else bool(sends_back)
        for name, value in attributes.items():
            if name.startswith("_") or not hasattr(type(self), name) or callable(getattr(type(self), name)):
                raise TypeError(f"{type(self).__name__} has no attribute {name!r} (the core's error table)")
            setattr(self, name, value)


class ConfigurationError(IdempotentJobError):
    """Invalid configuration or option (a bad database_url, an unknown setting or task
    option, a lease out of range). Fix the code or settings; retrying does not help."""


class UnreadableRecordError(ConfigurationError):
    """A record the database holds but the core cannot read (a time edited by hand to
    ``'infinity'``, which no Python time holds): the message names the record and the
    column. A ConfigurationError (not retried: reading again reads the same value), its
    own class so that a caller can tell it from a refused argument."""


class ConnectionError(IdempotentJobError):  # noqa: A001 - the Ruby gem's name
    """PostgreSQL could not be reached or the connection was lost. The body did not run
    (fail closed); retryable."""

    always_retryable = True


class DatabaseError(IdempotentJobError):
    """PostgreSQL answered with an error: the message is its own text, ``sqlstate`` its
    code (42P01: run ``idempotent_job.migrate()``). ``retryable`` is true for a transient
    answer (read-only during a failover, serialization failure, deadlock, class 53)."""


class LostClaimError(IdempotentJobError):
    """A completion or release was refused: the claim's fencing token is no longer the
    record's (its lease ran out and another delivery took the operation over). The body
    ran; the other delivery may run it again. ``job_type`` and ``operation_key`` name it."""

    #: The record's job type (str).
    job_type: str | None = None
    #: The record's operation key (str).
    operation_key: str | None = None


class MigrationError(IdempotentJobError):
    """A migration failed; its transaction was rolled back."""


class OperationKeyError(IdempotentJobError):
    """A task's ``idempotency_key`` declaration is malformed, or a delivery's arguments do
    not yield an operation key (missing, None, empty or an unsupported type). The body is
    not run and nothing is recorded. ``job_type`` and ``job_class`` name the task,
    ``declaration`` is the declaration as given (None for a key given directly)."""

    #: The record's job type (the task's name), when known (str or None).
    job_type: str | None = None
    #: The task (its name), when known (str or None).
    job_class: str | None = None
    #: The ``idempotency_key`` declaration as given, when declared (else None).
    declaration: Any = None


class LookupError(IdempotentJobError):  # noqa: A001 - the Ruby gem's name
    """A ``lookup`` callable raised or answered something other than "done", "not_done"
    or "unknown". The body was not run. ``job_type`` and ``operation_key`` name the record."""

    #: The record's job type (str).
    job_type: str | None = None
    #: The record's operation key (str).
    operation_key: str | None = None


class PayloadMismatchError(IdempotentJobError):
    """A delivery's payload differs from that of the operation's claim (same operation
    key, different payload) and ``on_mismatch="raise"``. The body was not run.
    ``job_type`` and ``operation_key`` name the record."""

    #: The record's job type (str).
    job_type: str | None = None
    #: The record's operation key (str).
    operation_key: str | None = None


class LockTimeoutError(IdempotentJobError):
    """A lock wait ran past its bound (SQLSTATE 55P03). Retryable."""

    always_retryable = True


class TimeoutError(IdempotentJobError):  # noqa: A001 - the Ruby gem's name
    """A configured timeout ran out (connect_timeout, checkout_timeout, statement_timeout
    or the call's deadline). Nothing was decided; the body did not run. Retryable."""

    always_retryable = True
