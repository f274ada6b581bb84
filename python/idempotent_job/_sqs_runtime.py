"""The runtimes around the SQS door (``idempotent_job.sqs``, which imports each of these
names: import them from there): :class:`Consumer`, a long-polling consumer loop over one
queue (threads, FIFO lanes, the visibility keeper, signals); :func:`batch_handler`, an AWS
Lambda SQS batch handler; :func:`resender`, a rerun sender for SQS records. None of them
decides anything: each message goes through the door (``sqs._Door.decide``) and is
settled by its SQS calls (``sqs._Queue``). Logs as ``idempotent_job.sqs``, the door's
logger."""

from __future__ import annotations

import json
import math
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from . import Rerun
from .sqs import Message, _door, _Queue, logger

__all__ = ["Consumer", "batch_handler", "resender"]


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
        self.queue = _Queue(client, queue_url, self.door.job_type)
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
                self.queue.visible_in(message, 0)
                actions.append("returned")
                continue
            action, seconds = self.door.decide(message, self.queue_url, self._track)
            self.queue.settle(message, action, seconds)
            actions.append(action)
        return actions

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
                self.queue.extend(running, math.ceil(protocol.lease))


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
