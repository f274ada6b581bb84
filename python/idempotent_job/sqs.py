"""The SQS door: what one SQS message means to the core's protocol. A message's body,
attributes and receive count become one delivery (:class:`Message`, the key a job type's
declaration reads from it); the core's decision becomes the SQS call that settles the
message (delete it, make it visible again, leave it for redelivery, extend its
visibility while its body runs). The runtimes around it, in ``_sqs_runtime`` and
imported from here, are :class:`Consumer` (a long-polling consumer loop),
:func:`batch_handler` (an AWS Lambda SQS batch handler) and :func:`resender` (a rerun
sender); each runs a message's body at most once per operation key, with the record in
PostgreSQL (the same table and protocol as the Celery and Sidekiq doors).

    consumer = Consumer(queue_url, charge, job_type="ChargeOrder", key="body.order_id", lease=60)
    consumer.run()          # until SIGTERM / SIGINT or consumer.stop()

What a message's delivery decides (python/README.md, "SQS consumers"): ran or a repeat of a
completed, held or given-up operation: the message is deleted; in progress elsewhere: the
message is made visible again after the core's ``retry_after``; a raising body or a claim
that failed for good: the message is left (it comes back when its visibility timeout ends,
or goes to the queue's dead-letter queue under its redrive policy); a claim that failed
with a retryable error (PostgreSQL unreachable): visible again after the core's
``unreachable_delay``. While a body runs, its message's visibility is extended to the lease
on the heartbeat's beat (the core's renewal interval), so no copy is delivered while the
first run lives. This module only translates SQS's vocabulary; the protocol is the core's.
Needs boto3 (``pip install idempotent_job[sqs]``) for :class:`Consumer`.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from . import _job_type
from ._door import JobProtocol, claim_failed, deliver, key_of, parse_key
from ._native import TOO_DEEP, check_option, delivery_count, key_refusal
from .errors import ConfigurationError, IdempotentJobError, OperationKeyError

if TYPE_CHECKING:  # imported on first use (below): the runtime module imports this one
    from ._sqs_runtime import Consumer, batch_handler, resender

__all__ = ["Consumer", "Message", "batch_handler", "resender"]
#: The runtimes around the door (``_sqs_runtime``), each imported from here.
RUNTIME = ("Consumer", "batch_handler", "resender")

logger = logging.getLogger("idempotent_job.sqs")

#: Where a key declaration's part may read: the JSON body, the message attributes the
#: producer set, or the message's system attributes (``attributes.MessageGroupId``).
SOURCES = ("body", "message_attributes", "attributes")
#: The core's job options this door takes none of: ``scope`` (``job_type`` is the record's
#: job type), refused by :func:`_door` and left out of an unknown option's known list.
NOT_TAKEN = ("scope",)
#: The door's words in the core's log lines: a delivery's id, a deferral, a crash.
WORDS = {
    "id_label": "message",
    "defer_text": "visible again in",
    "crash_text": "the consumer is going away (SystemExit or KeyboardInterrupt)",
}


@dataclass(frozen=True)
class Message:
    """One SQS message, from ``receive_message`` or a Lambda event record.

    ``body`` is the JSON-decoded body (the text when it is not JSON), ``attributes`` the
    system attributes (str values: ``ApproximateReceiveCount``, ``MessageGroupId``…),
    ``message_attributes`` the producer's attributes (name → their string or binary value),
    ``unread`` why the body was not decoded as JSON (None when it was).
    """

    message_id: str
    receipt_handle: str
    text: str
    body: Any
    attributes: dict
    message_attributes: dict
    unread: str | None = None

    @classmethod
    def of(cls, raw: dict) -> Message:
        """From a ``receive_message`` message (``MessageId``…) or a Lambda record (``messageId``…)."""
        lam = "messageId" in raw
        text = raw["body" if lam else "Body"]
        unread = None
        try:
            body = json.loads(text)
        except RecursionError:  # a hostile body: never a crash of the consumer (issue 29)
            body, unread = text, f"its body holds {TOO_DEEP} (Python's JSON reader gave up)"
        except ValueError as error:  # not JSON, or an int longer than Python reads
            body, unread = text, f"its body is not JSON Python reads: {error}"
        attributes = raw.get("messageAttributes" if lam else "MessageAttributes") or {}
        values = {
            name: a.get(
                "stringValue" if lam else "StringValue", a.get("binaryValue" if lam else "BinaryValue")
            )
            for name, a in attributes.items()
        }
        return cls(
            raw["messageId" if lam else "MessageId"],
            raw["receiptHandle" if lam else "ReceiptHandle"],
            text,
            body,
            dict(raw.get("attributes" if lam else "Attributes") or {}),
            values,
            unread,
        )

    @property
    def receive_count(self) -> int:
        """How often SQS delivered this message (1 the first time; 1 when the message has
        no ``ApproximateReceiveCount``, as a hand-made Lambda event may not). Raises
        ``ConfigurationError`` naming the message and the attribute for a count that is
        not a whole number from 1 to ``2**32`` (the core's delivery count rule): text, a
        sign, a fraction, zero, a huge number."""
        return self.receive_count_of(f"SQS message {self.message_id}")

    def receive_count_of(self, job_type: str) -> int:
        """:attr:`receive_count`, its refusal naming ``job_type``."""
        value = self.attributes.get("ApproximateReceiveCount")
        if value is None:
            return 1
        what = f"message {self.message_id}'s attribute ApproximateReceiveCount"
        return delivery_count(job_type, what, value, 1)

    @property
    def group_id(self) -> str | None:
        """The FIFO message group, or None on a standard queue."""
        return self.attributes.get("MessageGroupId")


class _Door:
    """A job type's declaration (key, options) and the decision for one message."""

    def __init__(self, handler: Callable, job_type: str, key: Any, options: dict) -> None:
        if not callable(handler):
            raise TypeError(f"{job_type}: the SQS door needs a callable handler")
        for name, value in options.items():
            check_option(job_type, "", name, value, NOT_TAKEN)

        def refuse(problem: str) -> OperationKeyError:
            return OperationKeyError(
                f"{job_type}: key {key!r}: {problem}", job_class=job_type, job_type=job_type, declaration=key
            )

        # The shape (names, dotted paths, composites) is the core's parse of a key declaration;
        # the door only says where a path starts: the body or one of the attribute maps.
        parts = []
        for label, _index, head, segments in parse_key(key, refuse):
            if head not in SOURCES:
                raise refuse(
                    f"each part must be a dotted path starting with one of {', '.join(SOURCES)} "
                    f"(e.g. 'body.order_id', 'message_attributes.OrderId'), got {label!r}"
                )
            parts.append((label, head, segments))
        self.handler, self.job_type, self.key, self.parts = handler, job_type, key, parts
        self.options = options
        self._protocol = JobProtocol(job_type, options, WORDS)  # checks the options now, naming the job type

    @property
    def protocol(self) -> Any:
        """The job type's protocol over ``configure``'s current defaults."""
        return self._protocol.get()

    def operation_key(self, message: Message) -> str:
        """The operation key the declaration's parts read from ``message``."""
        sources = {"body": message.body, "attributes": message.attributes}
        starts = [
            (sources.get(source, message.message_attributes), segments, None)
            for _label, source, segments in self.parts
        ]
        return key_of(
            self.job_type, self.key, starts, lambda part, problem: self._key_error(message, part, problem)
        )

    def _key_error(self, message: Message, part: int, problem: str) -> OperationKeyError:
        label, source, _segments = self.parts[part]
        why = f" ({message.unread})" if source == "body" and message.unread else ""
        # The core's refusal (keys::refusal, every door's), in this door's words for where.
        return OperationKeyError(
            key_refusal(
                self.job_type,
                f"key {self.key!r}: message {message.message_id} has no {label!r}{why}: {problem}",
                "job",
            ),
            job_class=self.job_type,
            job_type=self.job_type,
            declaration=self.key,
        )

    def decide(
        self, message: Message, queue: str | None, running: Callable | None = None
    ) -> tuple[str, float]:
        """Delivers ``message``: returns ``("delete", 0)``, ``("defer", seconds)`` (make it
        visible again then) or ``("leave", 0)`` (it comes back after its visibility timeout).
        ``running(message, started)`` is told when the body starts (True) and ends (False)."""

        def body(claim: Any) -> Any:
            if running:
                running(message, True)
            try:
                return self.handler(message, claim)
            finally:
                if running:
                    running(message, False)

        try:
            # SQS writes it; a Lambda event may be made by anyone: a count the core's rule
            # refuses leaves the message (for redelivery or the redrive policy) unrun.
            receive_count = message.receive_count_of(self.job_type)
        except ConfigurationError as error:
            logger.error(
                "%s: message %s refused (%s); left for redelivery or the redrive policy",
                self.job_type,
                message.message_id,
                error,
            )
            return "leave", 0.0
        facts = {"message_id": message.message_id, "receive_count": receive_count}
        if message.group_id is not None:
            facts["message_group_id"] = message.group_id
        try:
            outcome, failed = deliver(
                "sqs",
                self.protocol,
                self.job_type,
                self.operation_key(message),
                body,
                message.body,
                message.message_id,
                receive_count - 1,
                self.job_type,
                queue,
                facts,
                self.options.get("lookup"),
            )
        except IdempotentJobError as error:
            logger.error(
                "%s: message %s failed (%s: %s); left for redelivery or the redrive policy",
                self.job_type,
                message.message_id,
                type(error).__name__,
                error,
            )
            return "leave", 0.0
        except Exception:
            logger.exception(
                "%s: message %s: the handler raised; left for redelivery", self.job_type, message.message_id
            )
            return "leave", 0.0
        if failed is not None:
            # The core's rule of which claim errors send a delivery back (an outage, a
            # database answer, a raising lookup) rather than fail it, and its logging
            # policy (one ERROR line per cause per interval): the Celery door's too.
            delay = claim_failed(
                logger,
                failed,
                receive_count - 1,
                f"{self.job_type}: message {message.message_id}",
                "visible again",
            )
            return "defer", delay
        if outcome.decision == "in_progress":
            return "defer", outcome.retry_after
        return "delete", 0.0


def _door(handler: Callable, job_type: str, key: Any, options: dict, door: str) -> _Door:
    if "scope" in options:  # the core's table knows scope; this door's job_type is it (NOT_TAKEN)
        raise ConfigurationError(
            f"{job_type}: {door} takes no scope option: job_type is the scope (the record's job "
            f"type); pass job_type={options['scope']!r} instead"
        )
    return _Door(handler, _job_type(job_type), key, {k: v for k, v in options.items() if v is not None})


class _Queue:
    """One queue's SQS calls that settle a decided message. A call that fails is logged,
    never raised: the message comes back after its visibility timeout and the record
    decides."""

    def __init__(self, client: Any, url: str, job_type: str) -> None:
        self.client, self.url, self.job_type = client, url, job_type

    def settle(self, message: Message, action: str, seconds: float) -> None:
        """Does what :meth:`_Door.decide` decided for ``message``: "delete" deletes it,
        "defer" makes it visible again in ``seconds``, "leave" leaves it (it comes back
        after its visibility timeout)."""
        if action == "defer":
            self.visible_in(message, seconds)
        elif action == "delete":
            try:
                self.client.delete_message(QueueUrl=self.url, ReceiptHandle=message.receipt_handle)
            except Exception as error:  # the copy comes back and finds the operation decided
                self._failed(message, "DeleteMessage", error)

    def visible_in(self, message: Message, seconds: float) -> None:
        """Makes ``message`` visible again in ``seconds`` (0 to SQS's 12 hours)."""
        try:
            self.client.change_message_visibility(
                QueueUrl=self.url,
                ReceiptHandle=message.receipt_handle,
                VisibilityTimeout=min(43200, max(0, math.ceil(seconds))),
            )
        except Exception as error:  # it comes back after its visibility timeout instead
            self._failed(message, "ChangeMessageVisibility", error)

    def _failed(self, message: Message, call: str, error: Exception) -> None:
        logger.warning(
            "%s: message %s: %s failed (%s: %s); the message comes back after its visibility "
            "timeout and the record decides",
            self.job_type,
            message.message_id,
            call,
            type(error).__name__,
            error,
        )

    def extend(self, running: list[str], seconds: int) -> None:
        """Sets ``running`` messages' (receipt handles) visibility to ``seconds`` from now
        (batches of 10); a failure is logged and the next beat tries again."""
        for start in range(0, len(running), 10):
            entries = [
                {"Id": str(n), "ReceiptHandle": handle, "VisibilityTimeout": seconds}
                for n, handle in enumerate(running[start : start + 10])
            ]
            try:
                answer = self.client.change_message_visibility_batch(QueueUrl=self.url, Entries=entries)
                failed = answer.get("Failed", [])
            except Exception as error:  # a network error: the next beat tries again
                failed = [{"Message": repr(error)}]
            for failure in failed:
                logger.warning("%s: could not extend a message's visibility: %s", self.job_type, failure)


def __getattr__(name: str) -> Any:
    """:data:`RUNTIME`'s names, from ``_sqs_runtime`` (imported on first use)."""
    if name in RUNTIME:
        from . import _sqs_runtime

        return getattr(_sqs_runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and :data:`RUNTIME`'s."""
    return sorted([*globals(), *RUNTIME])
