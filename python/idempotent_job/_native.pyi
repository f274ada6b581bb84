"""Types of the compiled core binding (idempotent_job._native, built by maturin from
python/src). Internal: the package's documented API re-exports Claim and Outcome and
wraps the rest; these stubs let type checkers (mypy --strict) see what crosses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, final

OPTION_NAMES: tuple[str, ...]
DEFAULT_RETENTION: float
DEFAULT_HELD_LIMIT: int
DEFAULT_PURGE_BATCH: int
DEFAULT_REPEATS_SINCE: float
DEFAULT_RESTART_WINDOW: float
SCHEMA_SQL: str
__version__: str

@final
class Claim:
    """The claim a body runs under."""

    @property
    def job_type(self) -> str: ...
    @property
    def operation_key(self) -> str: ...
    @property
    def token(self) -> str:
        """The fencing token (a UUID's text)."""
    @property
    def attempt(self) -> int: ...
    @property
    def kind(self) -> str:
        """ "first", "retry" or "takeover"."""
    @property
    def delivery_id(self) -> str | None: ...

@final
class Outcome:
    """What one delivery came to."""

    @property
    def decision(self) -> str:
        """ "ran", "completed", "in_progress", "held", "given_up" or "skipped"."""
    @property
    def value(self) -> Any:
        """The body's return value, or a replayed stored result."""
    @property
    def retry_after(self) -> float | None:
        """Seconds before a deferred copy should come back."""
    @property
    def lease_remaining(self) -> float | None: ...
    @property
    def holder(self) -> str | None: ...
    @property
    def duplicates(self) -> int | None: ...
    @property
    def replayed(self) -> bool: ...
    @property
    def waited(self) -> bool:
        """True when the delivery waited for a live claim to end (wait=) first."""
    @property
    def claim(self) -> Claim | None: ...
    @property
    def ran(self) -> bool: ...
    @property
    def result_state(self) -> str | None:
        """ "stored", "too_large", "unencodable" (not stored), or None (no store requested)."""
    @property
    def result_stored(self) -> bool: ...
    @property
    def label(self) -> str:
        """The outcome's label (as on the delivery's span): "ran", "reclaimed", "replayed",
        "waited", "skipped", "in_progress", "held", "given_up" or "refused"."""

@final
class JobProtocol:
    @property
    def store_result(self) -> bool: ...
    @property
    def lease(self) -> float: ...
    @property
    def renewal_interval(self) -> float: ...

@final
class Store:
    def __init__(self, settings_json: str) -> None: ...
    def migrate(self) -> list[str]: ...
    def held(self, job_type: str | None, limit: int) -> list[tuple[str, str]]: ...
    def resolve(self, job_type: str, operation_key: str, as_: str) -> dict[str, str | None] | None: ...
    def purge(self, older_than: float | None, batch: int) -> int: ...
    def find(self, job_type: str, operation_key: str) -> dict[str, Any] | None: ...
    def repeats(
        self, since: float, job_type: str | None, restarts: list[float], restart_window: object
    ) -> str: ...
    def settle(self) -> None: ...
    @staticmethod
    def operation_key(job: str, value: Any, composite: bool = False) -> str: ...
    def protocol(
        self, job: str, options: dict[str, Any], words: dict[str, str] | None, prefix: str = ""
    ) -> JobProtocol: ...
    def perform_once(
        self,
        protocol: JobProtocol,
        job_type: str,
        operation_key: str,
        body: Callable[[Claim], Any],
        payload: Any,
        id: str | None = None,  # noqa: A002 - the delivery id, as the binding names it
        deferrals: int = 0,
        job_class: str | None = None,
        queue: str | None = None,
        facts: dict[str, Any] | None = None,
        lookup: Callable[[str], Any] | None = None,
        wait: float | None = None,
    ) -> Outcome: ...
    def __getattr__(self, name: str) -> Any: ...

def describe_url(url: str) -> str: ...
def error_table_json() -> str: ...
def error_example(name: str) -> BaseException | None: ...
def key_refusal(job: str, problem: str, noun: str) -> str: ...
def deferrals_refusal(job: str, subject: str, shown: str) -> str: ...
def key_declaration(
    parts: Sequence[Any],
) -> tuple[list[tuple[str, int | None, str | None, list[str]]] | None, str | None]: ...
def check_option(job: str, prefix: str, name: str, value: Any, without: Sequence[str] = ()) -> Any: ...
def not_taken(job: str, call: str, name: str, known: Sequence[str]) -> None: ...
def args_digest(value: Any) -> str: ...
def repeats_report(operations_json: str) -> str: ...
def unreachable_delay(failures: int) -> float: ...
def delivery_count(job: str, what: str, value: Any, first: int = 0) -> int: ...
def check_wait(job: str, value: Any) -> float: ...
def check_time(name: str, value: Any) -> float: ...
def __getattr__(name: str) -> Any: ...

MAX_NESTING: int
MAX_DEFERRALS: int
MAX_INTEGER_DIGITS: int
TOO_DEEP: str

TRACER_NAME: str

def span_name(job_type: str) -> str: ...
def span_attributes(
    door: str, job_type: str, operation_key: str, outcome: Outcome
) -> dict[str, str | int | bool]: ...
