"""An SQS consumer loop with idempotent_job (the one python/README.md shows): each
message's effect runs at most once per operation key; a message whose operation is in
progress elsewhere is left invisible for `retry_after` seconds, then comes back."""

from __future__ import annotations

import json
import math

import idempotent_job


def consume_once(sqs, queue_url: str, handle, wait_seconds: int = 1) -> list[str]:
    """Receives one batch and handles it; returns the decisions taken."""
    batch = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds, AttributeNames=["All"]
    )
    decisions = []
    for message in batch.get("Messages", []):
        body = json.loads(message["Body"])
        receives = int(message["Attributes"].get("ApproximateReceiveCount", "1"))
        outcome = idempotent_job.perform_once(
            "ChargeOrder",
            body["order_id"],
            lambda claim, body=body: handle(body, claim.operation_key),
            lease=60,
            payload=body,
            id=message["MessageId"],
            deferrals=receives - 1,
        )
        decisions.append(outcome.decision)
        if outcome.decision == "in_progress":
            # Another consumer holds a live claim: come back when it may have finished.
            sqs.change_message_visibility(
                QueueUrl=queue_url,
                ReceiptHandle=message["ReceiptHandle"],
                VisibilityTimeout=max(1, math.ceil(outcome.retry_after)),
            )
        else:  # ran, completed, held or given up: this message is done
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return decisions
