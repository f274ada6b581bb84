"""The Celery door: ``IdempotentTask``, a task base class that runs a task's body at most
once per operation key, with the record in PostgreSQL (the same table and protocol as
the Ruby gem's Sidekiq and ActiveJob doors).

    @app.task(base=IdempotentTask, idempotency_key="order_id", idempotency_lease=60,
              idempotency_on_stale="hold", acks_late=True)
    def charge_order(order_id, cents): ...

It only translates Celery's vocabulary: the claim protocol runs in the native core.
Needs ``acks_late=True`` and ``task_reject_on_worker_lost=True`` and a broker visibility
timeout longer than the lease (see python/README.md, "Using it with Celery").
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, current_app
from celery.exceptions import Ignore, Retry

from . import Rerun, on_rerun
from ._door import JobProtocol, KeyPart, call_key_parts, call_start, claim_failed, deliver, key_of, parameters
from ._native import OPTION_NAMES, check_option, delivery_count, key_refusal
from .errors import ConfigurationError, OperationKeyError

__all__ = ["IdempotentTask", "send_rerun", "DEFERRALS_HEADER", "UNREACHABLE_HEADER", "ON_CLAIM_ERROR_SETTING"]

logger = logging.getLogger("idempotent_job.celery")
# Tasks warned about in this process for running with acks_late or reject_on_worker_lost off
# (_warn_early_ack).
_EARLY_ACK_WARNED: set[str] = set()

#: The message header counting how often a delivery met a live claim and was sent back.
DEFERRALS_HEADER = "idempotent_job_deferrals"
#: The message header counting how often a delivery's claim failed with a retryable
#: error (PostgreSQL unreachable or too slow) and the delivery was sent back.
UNREACHABLE_HEADER = "idempotent_job_unreachable"

#: How the door spells the job options as task options (``idempotency_lease``).
PREFIX = "idempotency_"
#: The options the door reads itself: ``key`` (the operation key's declaration) and
#: ``scope`` (the record's job type; default the task's name).
DOOR_OPTIONS = ("key", "scope")
#: The options the core applies per delivery: the core's table (its names, kinds,
#: values and defaults, crates/core/src/options/) less the door's.
CORE_OPTIONS = tuple(name for name in OPTION_NAMES if name not in DOOR_OPTIONS)
#: The Celery setting (``app.conf``) saying what the door does with a delivery whose
#: claim failed before its body ran with an error the core sends back (an outage, a
#: wrong database name, role or password, a missing table): ``"send_back"`` (the
#: default: the delivery comes back with the core's back-off, nothing is lost) or
#: ``"fail"`` (the task fails and Celery acknowledges its message: the delivery is lost).
ON_CLAIM_ERROR_SETTING = "idempotent_job_on_claim_error"
ON_CLAIM_ERROR_VALUES = ("send_back", "fail")
#: The door's words in the core's log lines: a delivery's id, a deferral, a crash.
WORDS = {
    "id_label": "task",
    "defer_text": "retry in",
    "crash_text": "the worker is going away (SystemExit or KeyboardInterrupt)",
}


def _resolve(task_name: str, declaration: Any, run: Any) -> list[KeyPart]:
    def fail(problem: str) -> OperationKeyError:
        return OperationKeyError(
            f"{task_name}: idempotency_key {declaration!r} {problem}",
            job_class=task_name,
            job_type=task_name,
            declaration=declaration,
        )

    return call_key_parts(task_name, declaration, parameters(run), fail)


class IdempotentTask(Task):
    """A Celery task base: one record per operation key (see the module's documentation).

    Task options (each optional except ``idempotency_key``):
        idempotency_key: the operation key's declaration: a parameter name (``"order_id"``),
            an argument index (``0``), a dotted path (``"payload.id"``, ``"0.id"``) or a list
            of those (a composite key).
        idempotency_scope: the record's job type (default: the task's name); a Sidekiq job
            with the same scope and key shares the record.
        idempotency_lease, idempotency_on_stale, idempotency_on_mismatch,
        idempotency_lookup, idempotency_heartbeat, idempotency_max_run: as
            ``idempotent_job.perform_once``'s options (default: ``configure``'s).
        idempotency_store_result: keep the return value for repeats (default True).
        idempotency_max_takeovers: the reclaim budget: stale takeovers of one operation
            before the next is held for a person (default None: no budget).

    A delivery of a completed operation returns the first run's stored result; one that
    meets a live claim is sent back with ``countdown=retry_after`` without using up
    ``max_retries``; one whose claim fails before the body started with an error the
    core sends back (``sends_back``: PostgreSQL unreachable or slower than the deadline,
    a wrong database name, role or password, a missing table) is sent back the same way
    after the core's ``unreachable_delay`` (1 s doubling, at most 60 s; counted in the
    ``UNREACHABLE_HEADER``), with an error line per cause once a minute, so the delivery
    is not lost (the app setting ``idempotent_job_on_claim_error="fail"`` fails it
    instead); a message carrying an ``idempotency_*`` option (``send_task(...,
    idempotency_x=...)``) fails with ``ConfigurationError`` naming it before anything is
    claimed, and so does one whose ``DEFERRALS_HEADER`` or ``UNREACHABLE_HEADER`` is
    not a count (the core's delivery count rule), naming the task and the header; a
    held or given-up operation raises ``celery.exceptions.Ignore``
    with a log line; a raising body releases the claim and re-raises (so
    ``autoretry_for`` and ``self.retry`` work as without the door); a lost worker
    (SIGKILL) leaves the claim until its lease ends.

    Raises at declaration (when Celery makes the task class), naming the task:
    ``ConfigurationError`` for an unknown ``idempotency_*`` option or a bad value,
    ``OperationKeyError`` for a malformed key declaration.
    """

    abstract = True
    idempotency_key: Any = None
    idempotency_scope: str | None = None
    idempotency_store_result: bool = True
    idempotency_lease: float | None = None
    idempotency_on_stale: str | None = None
    idempotency_on_mismatch: str | None = None
    idempotency_lookup: Any = None
    idempotency_heartbeat: bool | None = None
    idempotency_max_run: float | None = None
    idempotency_max_takeovers: int | None = None

    _idempotency_paths: list[KeyPart] | None = None
    _idempotency_protocol: JobProtocol

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Checks a task class when Celery makes it (one defining ``run``; an intermediate
        base class is left alone): every ``idempotency_*`` option by the core's table, the
        key declaration against ``run``'s parameters, then the task's options over
        ``configure``'s defaults. Raises ``ConfigurationError`` (an unknown option, with the
        nearest known name, or a bad value) or ``OperationKeyError`` (no or a malformed
        ``idempotency_key``), naming the task."""
        super().__init_subclass__(**kwargs)
        if "run" not in cls.__dict__:
            return  # an intermediate base class, not a task
        name = cls.__dict__.get("name") or cls.__name__
        # Every idempotency_* option by the core's table: an unknown name raises with
        # the nearest known one, a bad value with what it must be.
        for option in sorted(n for n in dir(cls) if n.startswith(PREFIX)):
            check_option(name, PREFIX, option[len(PREFIX) :], getattr(cls, option))
        if cls.idempotency_key is None:
            raise OperationKeyError(
                f"{name}: IdempotentTask needs idempotency_key= (a parameter name, an argument "
                "index, a dotted path or a list of those)",
                job_class=name,
                job_type=name,
            )
        cls._idempotency_paths = _resolve(name, cls.idempotency_key, cls.__dict__.get("run"))
        lookup = cls.__dict__.get("idempotency_lookup", cls.idempotency_lookup)
        if isinstance(lookup, staticmethod):
            lookup = lookup.__func__
        cls._idempotency_lookup_fn = staticmethod(lookup) if lookup is not None else None
        options = {n: getattr(cls, PREFIX + n, None) for n in CORE_OPTIONS if n != "lookup"}
        options["lookup"] = cls._idempotency_lookup_fn
        # The task's options over configure's defaults, checked now naming the task.
        cls._idempotency_protocol = JobProtocol(cls.idempotency_scope or name, options, WORDS, PREFIX)

    def _operation_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        paths = self._idempotency_paths or []
        starts = [call_start(path, args, kwargs, "the task") for path in paths]
        return key_of(
            self.name,
            self.idempotency_key,
            starts,
            lambda part, problem: self._key_error(paths[part][0], problem),
        )

    def _key_error(self, label: str, problem: str) -> OperationKeyError:
        return OperationKeyError(
            key_refusal(self.name, f"idempotency key {self.idempotency_key!r} ({label}): {problem}", "task"),
            job_class=self.name,
            job_type=self.name,
            declaration=self.idempotency_key,
        )

    def apply_async(self, args=None, kwargs=None, *rest: Any, **options: Any):  # noqa: D401
        """Celery's ``apply_async``; checks first that the arguments yield an operation key,
        so a bad key raises ``OperationKeyError`` at ``delay()`` naming the task, and that
        no ``idempotency_*`` option is given per call (they are the task's: a misspelled
        one raises ``ConfigurationError`` with the nearest known name, a known one says
        to declare it on the task), rather than a message sent with an option ignored."""
        self._refuse_message_options(options, "")
        if not options.get("retries"):
            self._operation_key(tuple(args or ()), dict(kwargs or {}))
        return super().apply_async(args, kwargs, *rest, **options)

    def _refuse_message_options(self, names: Any, where: str) -> None:
        """Raises ``ConfigurationError`` naming the task for the first ``idempotency_*``
        name in ``names``: an unknown one with the nearest known one (the core's table),
        a known one saying it is the task's (declared on the task, never per message)."""
        for option in sorted(n for n in names if isinstance(n, str) and n.startswith(PREFIX)):
            check_option(self.name, PREFIX, option[len(PREFIX) :], None)
            raise ConfigurationError(
                f"{self.name}: {option}{where} is a task option: declare it on the task "
                f"(@app.task(..., {option}=...)); per-call idempotency options are not taken"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs one delivery of the task at most once per operation key (the class's
        documentation says what each outcome does). Returns the body's value, or the stored
        result of a completed operation; raises Celery's ``Retry`` when the delivery is sent
        back (a live claim; a claim that failed with an error the core sends back),
        ``Ignore`` for a held or given-up operation, ``ConfigurationError`` for an
        ``idempotency_*`` option or a bad count header in the message (nothing claimed),
        ``OperationKeyError`` when the arguments yield no operation key, and the body's own
        errors after releasing the claim. Called directly or eagerly (or with the app's
        ``ON_CLAIM_ERROR_SETTING`` at ``"fail"``) a failed claim's error is raised instead of
        a send-back; called directly or eagerly, a live claim raises ``Ignore``."""
        request = self.request
        if not request.called_directly:
            # Options a producer put in the message (send_task(..., idempotency_x=...),
            # another language's producer, a header): refused before anything is
            # claimed, so the task fails visibly rather than run under the defaults.
            for names in (vars(request), getattr(request, "properties", None) or {}, request.headers or {}):
                self._refuse_message_options(names, " (sent in the message)")
            if not (self.acks_late and self.reject_on_worker_lost) and not request.is_eager:
                self._warn_early_ack()
        key = self._operation_key(args, kwargs)
        job_type = self.idempotency_scope or self.name
        deferrals = self._count(request, DEFERRALS_HEADER)
        payload = list(args) + ([kwargs] if kwargs else [])
        delivery_info = getattr(request, "delivery_info", None) or {}
        facts: dict[str, Any] = {"task_id": request.id, "retries": request.retries or 0}
        if kwargs:
            # The payload ends with the keyword arguments: a rerun sends them as such.
            facts["kwargs"] = sorted(kwargs)
        if deferrals:
            facts["deferrals"] = deferrals
        unreachable = self._count(request, UNREACHABLE_HEADER)
        parent = super()
        outcome, error = deliver(
            "celery",
            self._idempotency_protocol.get(),
            job_type,
            key,
            lambda claim: parent.__call__(*args, **kwargs),
            payload,
            request.id,
            deferrals,
            self.name,
            delivery_info.get("routing_key"),
            facts,
            self._idempotency_lookup_fn,
        )
        if error is not None:
            if request.called_directly or request.is_eager or self._on_claim_error() == "fail":
                # No worker to send the delivery back to, or the app chose "fail".
                raise error
            # The claim could not be made or answered (an outage, a wrong database URL,
            # a missing table): the body did not run. Failing would let Celery
            # acknowledge the message and drop the delivery.
            countdown = claim_failed(
                logger,
                error,
                unreachable,
                f"{self.name}[{request.id}]: operation {key!r} of {job_type}",
                "the task is sent back",
            )
            self._send_back(
                countdown,
                {DEFERRALS_HEADER: deferrals, UNREACHABLE_HEADER: unreachable + 1},
                f"claim failed ({type(error).__name__})",
            )
        decision = outcome.decision
        if decision in ("ran", "completed"):
            return outcome.value
        if decision == "in_progress":
            self._send_back(
                outcome.retry_after,
                {DEFERRALS_HEADER: deferrals + 1, UNREACHABLE_HEADER: unreachable},
                "operation in progress",
            )
        # Held or given up: the core's note said so (and how to settle it).
        raise Ignore()

    def _warn_early_ack(self) -> None:
        """Warns once per task and process that the task's message can be acknowledged
        without its run ending: with ``acks_late`` off (Celery's default) before it runs,
        with ``reject_on_worker_lost`` off (also the default) as failed when its pool child
        dies. Either way a worker killed mid-task loses the message, and its claim waits
        for a redelivery that never comes."""
        if self.name in _EARLY_ACK_WARNED:
            return
        _EARLY_ACK_WARNED.add(self.name)
        if not self.acks_late:
            logger.warning(
                "%s: acks_late is off, so a worker killed mid-task loses its message: its claim waits "
                "until the lease ends for a redelivery that never comes; set acks_late=True (or "
                "task_acks_late) and task_reject_on_worker_lost=True (python/README.md, Celery settings)",
                self.name,
            )
        else:
            logger.warning(
                "%s: reject_on_worker_lost is off, so a pool child killed mid-task (SIGKILL, out of "
                "memory) has its message acknowledged as failed, not redelivered: its claim waits until "
                "the lease ends for a redelivery that never comes; set reject_on_worker_lost=True (or "
                "task_reject_on_worker_lost) (python/README.md, Celery settings)",
                self.name,
            )

    def _count(self, request: Any, header: str) -> int:
        """The door's count in this message's ``header`` (``DEFERRALS_HEADER``,
        ``UNREACHABLE_HEADER``; 0 when absent) by the core's rule (a whole number from 0
        to ``MAX_DEFERRALS``, an int or its decimal text). Raises ``ConfigurationError``
        naming the task and the header for anything else (text, a float, a bool, a
        negative or huge number: another producer's header), before anything is claimed:
        the task fails visibly (Celery's failure, in the result backend) rather than
        with a bare ``ValueError``, and nothing runs or is recorded."""
        value = _header(request, header)
        if value is None:
            return 0
        return delivery_count(self.name, f"the message header {header}", value)

    def _on_claim_error(self) -> str:
        """The app's ``ON_CLAIM_ERROR_SETTING`` (``"send_back"`` unless set); raises
        ``ConfigurationError`` naming the setting for any other value."""
        value = self.app.conf.get(ON_CLAIM_ERROR_SETTING) or "send_back"
        if value not in ON_CLAIM_ERROR_VALUES:
            raise ConfigurationError(
                f"Celery setting {ON_CLAIM_ERROR_SETTING}={value!r}: must be one of "
                f"{', '.join(repr(v) for v in ON_CLAIM_ERROR_VALUES)}"
            )
        return value

    def _send_back(self, countdown: float, counts: dict[str, int], reason: str) -> None:
        """Sends this delivery again in ``countdown`` seconds with the same retry count (a
        live claim or an unreachable database is not the task's failure: ``max_retries``
        is not used up) and the headers ``counts`` (``DEFERRALS_HEADER``,
        ``UNREACHABLE_HEADER``: how often it was sent back so far), then raises Celery's
        ``Retry`` (its message starts with ``reason``) so the worker acknowledges this
        message."""
        request = self.request
        if request.called_directly or request.is_eager:
            # No worker to come back to: the caller sees the outcome through the log line.
            raise Ignore()
        headers = dict(request.headers or {})
        headers.update(counts)
        signature = self.signature_from_request(
            request,
            None,
            None,
            countdown=countdown,
            retries=request.retries or 0,
            headers=headers,
            **counts,
        )
        signature.apply_async()
        raise Retry(f"{reason}; back in {countdown:.1f} s", None, when=countdown)


@on_rerun
def send_rerun(rerun: Rerun) -> bool:
    """The Celery door's rerun sender (registered with ``idempotent_job.on_rerun`` when
    this module is imported): sends the stored delivery of an operation resolved with
    ``resolve(..., as_="rerun")`` as a new task message through the current Celery app
    (``send_task`` by the task's name, with the stored arguments, keyword arguments when
    the first claim had them, on the stored routing key as its queue). Takes a record
    whose first claim was this door's delivery (its ``task_id`` fact; the task need not be
    registered here: a producer-only process sends by name); returns False for any other
    record. Never finalizes the app's pending tasks."""
    facts = rerun.first_facts or {}
    name = rerun.job_class
    if name is None or "task_id" not in facts:
        return False
    args = rerun.args if isinstance(rerun.args, list) else ([] if rerun.args is None else [rerun.args])
    kwargs: dict[str, Any] = {}
    names = facts.get("kwargs")
    if names and args and isinstance(args[-1], dict) and sorted(args[-1]) == sorted(names):
        args, kwargs = args[:-1], args[-1]
    current_app.send_task(name, args=args, kwargs=kwargs, queue=rerun.queue)
    return True


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value
