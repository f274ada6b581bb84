"""The SQS door: a consumer loop (:class:`Consumer`) and an AWS Lambda SQS batch handler
(:func:`batch_handler`) that run a message's body at most once per operation key, with the
record in PostgreSQL (the same table and protocol as the Celery and Sidekiq doors).

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
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from . import Rerun, _job_type
from ._door import JobProtocol, claim_failed, deliver, key_of, parse_key
from ._native import TOO_DEEP, check_option, delivery_count, key_refusal
from .errors import ConfigurationError, IdempotentJobError, OperationKeyError

__all__ = ["Consumer", "Message", "batch_handler", "resender"]

logger = logging.getLogger("idempotent_job.sqs")

#: Where a key declaration's part may read: the JSON body, the message attributes the
#: producer set, or the message's system attributes (``attributes.MessageGroupId``).
SOURCES = ("body", "message_attributes", "attributes")
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
            check_option(job_type, "", name, value)

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
    if "scope" in options:  # the core's table knows scope; this door's job_type is it
        raise ConfigurationError(
            f"{job_type}: {door} takes no scope option: job_type is the scope (the record's job "
            f"type); pass job_type={options['scope']!r} instead"
        )
    return _Door(handler, _job_type(job_type), key, {k: v for k, v in options.items() if v is not None})


class Consumer:
    """A long-polling consumer of one SQS queue (standard or FIFO) through the door.

    Args:
        queue_url: the queue's URL.
        handler: ``handler(message, claim)``: the body, run at most once per operation with
            the :class:`Message` and the claim (``claim.operation_key``); its return value
            is stored for repeats when ``store_result`` is True.
        job_type: the record's job type (a Celery task or Sidekiq job with the same job
            type and key shares the record).
        key: the operation key's declaration: a dotted path starting with ``body``,
            ``message_attributes`` or ``attributes`` (``"body.order_id"``,
            ``"message_attributes.OrderId"``) or a list of those (a composite key).
        client: a boto3 SQS client (default ``boto3.client("sqs")``).
        workers: bodies run at once (threads; one message group at a time per thread on
            a FIFO queue).
        max_messages, wait_seconds: ``receive_message``'s batch size (1–10) and long poll.
        options: the core's job options (``lease``, ``on_stale``, ``on_mismatch``,
            ``lookup``, ``heartbeat``, ``max_run``, ``max_takeovers``, ``store_result``; default configure's).
            No ``scope``: ``job_type`` is the record's job type.

    Raises ``ConfigurationError`` (an unknown option, ``scope``, or a bad value) and
    ``OperationKeyError`` (a malformed key declaration) naming the job type.
    """

    def __init__(
        self,
        queue_url: str,
        handler: Callable,
        *,
        job_type: str,
        key: Any,
        client: Any = None,
        workers: int = 1,
        max_messages: int = 10,
        wait_seconds: int = 20,
        **options: Any,
    ) -> None:
        self.door = _door(handler, job_type, key, options, "Consumer")
        if client is None:
            import boto3

            client = boto3.client("sqs")
        self.client, self.queue_url = client, queue_url
        self.fifo = queue_url.endswith(".fifo")
        self.max_messages, self.wait_seconds = max_messages, wait_seconds
        self.pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="idempotent_job.sqs") if workers > 1 else None
        )
        self._stopping = threading.Event()
        # Bodies running now: message id -> (receipt handle, monotonic start).
        self._running: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._keeper: threading.Thread | None = None

    def stop(self) -> None:
        """Stops polling; the bodies running now finish (``run`` returns after them)."""
        self._stopping.set()

    def run(self) -> None:
        """Polls until :meth:`stop`, SIGTERM or SIGINT (handlers installed when called on the
        main thread, restored on return). Warns first when the queue's visibility timeout
        is shorter than the lease's renewal interval (a copy could be delivered before
        the first extension)."""
        self.check_visibility_timeout()
        restore = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                restore[sig] = signal.signal(sig, lambda *_: self.stop())
        try:
            while not self._stopping.is_set():
                try:
                    self.poll()
                except Exception:  # SQS unreachable: nothing was received; try again
                    logger.exception(
                        "%s: receiving from %s failed; again in 1 s", self.door.job_type, self.queue_url
                    )
                    self._stopping.wait(1)
        finally:
            for sig, previous in restore.items():
                signal.signal(sig, previous)

    def check_visibility_timeout(self) -> bool:
        """Logs a warning and returns False when the queue's visibility timeout is shorter
        than the lease's renewal interval."""
        answer = self.client.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"]
        )
        timeout = int(answer["Attributes"]["VisibilityTimeout"])
        interval = self.door.protocol.renewal_interval
        if timeout < interval:
            logger.warning(
                "%s: queue %s has a visibility timeout of %d s, shorter than the lease's renewal "
                "interval (%.1f s): a message may be delivered again before its visibility is first "
                "extended; raise the queue's VisibilityTimeout above %.0f s",
                self.door.job_type,
                self.queue_url,
                timeout,
                interval,
                math.ceil(interval),
            )
            return False
        return True

    def poll(self) -> list[str]:
        """Receives one batch (long polling) and delivers its messages; returns the action
        taken for each ("delete", "defer", "leave", or "returned" for a message not started
        because the consumer is stopping)."""
        answer = self.client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.max_messages,
            WaitTimeSeconds=self.wait_seconds,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = [Message.of(raw) for raw in answer.get("Messages", [])]
        if not self.fifo:
            lanes = [[m] for m in messages]
        else:  # a FIFO group's messages in order, the group stopped at its first one not deleted
            groups: dict[Any, list[Message]] = {}
            for m in messages:
                groups.setdefault(m.group_id, []).append(m)
            lanes = list(groups.values())
        runs = self.pool.map(self._lane, lanes) if self.pool else map(self._lane, lanes)
        return [action for actions in runs for action in actions]

    def _lane(self, messages: list[Message]) -> list[str]:
        actions = []
        for message in messages:
            if self._stopping.is_set() or (actions and actions[-1] != "delete"):
                # Not started: back to the queue at once (a FIFO group keeps its order).
                self._visible_in(message, 0)
                actions.append("returned")
                continue
            action, seconds = self.door.decide(message, self.queue_url, self._track)
            if action == "delete":
                try:
                    self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message.receipt_handle)
                except Exception as error:  # the copy comes back and finds the operation decided
                    self._sqs_failed(message, "DeleteMessage", error)
            elif action == "defer":
                self._visible_in(message, seconds)
            actions.append(action)
        return actions

    def _visible_in(self, message: Message, seconds: float) -> None:
        try:
            self.client.change_message_visibility(
                QueueUrl=self.queue_url,
                ReceiptHandle=message.receipt_handle,
                VisibilityTimeout=min(43200, max(0, math.ceil(seconds))),
            )
        except Exception as error:  # it comes back after its visibility timeout instead
            self._sqs_failed(message, "ChangeMessageVisibility", error)

    def _sqs_failed(self, message: Message, call: str, error: Exception) -> None:
        logger.warning(
            "%s: message %s: %s failed (%s: %s); the message comes back after its visibility "
            "timeout and the record decides",
            self.door.job_type,
            message.message_id,
            call,
            type(error).__name__,
            error,
        )

    def _track(self, message: Message, started: bool) -> None:
        with self._lock:
            if started:
                self._running[message.message_id] = (message.receipt_handle, time.monotonic())
                if self._keeper is None:
                    self._keeper = threading.Thread(
                        target=self._keep, name="idempotent_job.sqs.keeper", daemon=True
                    )
                    self._keeper.start()
            else:
                self._running.pop(message.message_id, None)

    def _keep(self) -> None:
        """On the heartbeat's beat, extends every running body's message to one lease from now,
        until the body has run ``max_run`` seconds (when the heartbeat stops renewing its claim:
        a hung body's message then comes back within one lease, as its claim goes stale)."""
        protocol = self.door.protocol
        while True:
            time.sleep(protocol.renewal_interval)
            with self._lock:  # held while extending: a body ending waits, then deletes its message
                now = time.monotonic()
                running = [
                    handle for handle, start in self._running.values() if now - start < protocol.max_run
                ]
                self._extend(running, math.ceil(protocol.lease))

    def _extend(self, running: list[str], seconds: int) -> None:
        """Sets ``running`` messages' visibility to ``seconds`` from now (batches of 10)."""
        for start in range(0, len(running), 10):
            entries = [
                {"Id": str(n), "ReceiptHandle": handle, "VisibilityTimeout": seconds}
                for n, handle in enumerate(running[start : start + 10])
            ]
            try:
                answer = self.client.change_message_visibility_batch(QueueUrl=self.queue_url, Entries=entries)
                failed = answer.get("Failed", [])
            except Exception as error:  # a network error: the next beat tries again
                failed = [{"Message": repr(error)}]
            for failure in failed:
                logger.warning("%s: could not extend a message's visibility: %s", self.door.job_type, failure)


def resender(client: Any = None, job_type: str | None = None) -> Callable[[Rerun], bool]:
    """A rerun sender for SQS records, to register with ``idempotent_job.on_rerun``:
    ``resolve(..., as_="rerun")`` then sends the released operation's stored message body
    to its stored queue URL again (``send_message``; on a FIFO queue with the first
    claim's message group and a fresh deduplication id, so SQS does not drop it as a copy
    of the first). Takes records of ``job_type`` (default: any record whose first claim
    was an SQS delivery, a ``message_id`` fact). Only the body is sent: a key read from
    message attributes needs a sender of your own. ``client``: a boto3 SQS client
    (default ``boto3.client("sqs")``, made on first use)."""
    clients: list[Any] = [client]

    def send(rerun: Rerun) -> bool:
        facts = rerun.first_facts or {}
        if rerun.queue is None:
            return False
        if rerun.job_type != job_type if job_type is not None else "message_id" not in facts:
            return False
        if clients[0] is None:
            import boto3

            clients[0] = boto3.client("sqs")
        body = rerun.args if isinstance(rerun.args, str) else json.dumps(rerun.args)
        extra = {}
        if rerun.queue.endswith(".fifo"):
            extra = {
                "MessageGroupId": facts.get("message_group_id") or rerun.operation_key,
                "MessageDeduplicationId": uuid.uuid4().hex,
            }
        clients[0].send_message(QueueUrl=rerun.queue, MessageBody=body, **extra)
        return True

    return send


def batch_handler(
    handler: Callable, *, job_type: str, key: Any, client: Any = None, **options: Any
) -> Callable[[dict, Any], dict]:
    """An AWS Lambda handler for an SQS event source with partial batch responses
    (``ReportBatchItemFailures``): ``handler(message, claim)`` runs at most once per
    operation; the function returns ``{"batchItemFailures": [{"itemIdentifier": id}…]}``
    naming the records to deliver again: an operation in progress elsewhere, a raising
    handler, a claim that failed. With ``client`` (boto3 SQS), an in-progress record's
    visibility is set to the core's ``retry_after`` first. On a FIFO queue the records after
    a failed one are not run and reported as failures too (SQS keeps the group's order).
    ``job_type``, ``key`` and ``options``: as :class:`Consumer`'s."""
    door = _door(handler, job_type, key, options, "batch_handler")

    def handle(event: dict, context: Any = None) -> dict:
        failures: list[dict] = []
        for record in event.get("Records", []):
            message = Message.of(record)
            arn = record.get("eventSourceARN", "")
            if failures and arn.endswith(".fifo"):
                failures.append({"itemIdentifier": message.message_id})
                continue
            action, seconds = door.decide(message, arn or None)
            if action == "delete":
                continue
            failures.append({"itemIdentifier": message.message_id})
            if action == "defer" and client is not None:
                *_, account, name = arn.split(":")
                url = client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
                client.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=message.receipt_handle, VisibilityTimeout=math.ceil(seconds)
                )
        return {"batchItemFailures": failures}

    return handle
