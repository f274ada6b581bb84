"""The exceptions of idempotent_job: one base, :class:`IdempotentJobError`, and the
same subclasses as the Ruby gem (``lib/idempotent_job/errors.rb``). The native layer
raises them by name from the core's one error enum; every class, its attributes and
whether it is always retryable are checked against the core's error table
(``_native.error_table_json()``) by ``tests/test_errors.py``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "IdempotentJobError",
    "ConfigurationError",
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
        job_type: the job type concerned, when known (str or None).
        operation_key: the operation key concerned, when known (str or None).
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
        job_type: str | None = None,
        operation_key: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.retryable = self.always_retryable if retryable is None else bool(retryable)
        self.sends_back = self.retryable if sends_back is None else bool(sends_back)
        self.job_type = job_type
        self.operation_key = operation_key
        for name, value in extra.items():
            setattr(self, name, value)


class ConfigurationError(IdempotentJobError):
    """Invalid configuration or option (a bad database_url, an unknown setting or task
    option, a lease out of range). Fix the code or settings; retrying does not help."""


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


class MigrationError(IdempotentJobError):
    """A migration failed; its transaction was rolled back."""


class OperationKeyError(IdempotentJobError):
    """A task's ``idempotency_key`` declaration is malformed, or a delivery's arguments do
    not yield an operation key (missing, None, empty or an unsupported type). The body is
    not run and nothing is recorded. ``job_class`` names the task, ``declaration`` is the
    declaration as given."""


class LookupError(IdempotentJobError):  # noqa: A001 - the Ruby gem's name
    """A ``lookup`` callable raised or answered something other than "done", "not_done"
    or "unknown". The body was not run."""


class PayloadMismatchError(IdempotentJobError):
    """A delivery's payload differs from that of the operation's claim (same operation
    key, different payload) and ``on_mismatch="raise"``. The body was not run."""


class LockTimeoutError(IdempotentJobError):
    """A lock wait ran past its bound (SQLSTATE 55P03). Retryable."""

    always_retryable = True


class TimeoutError(IdempotentJobError):  # noqa: A001 - the Ruby gem's name
    """A configured timeout ran out (connect_timeout, checkout_timeout, statement_timeout
    or the call's deadline). Nothing was decided; the body did not run. Retryable."""

    always_retryable = True
