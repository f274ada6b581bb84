"""A consumer process for the SQS tests, against moto_server (an SQS emulator):

    sqs_worker.py door|control QUEUE_URL SCENARIO [options]

``door`` runs idempotent_job.sqs.Consumer (until SIGTERM); ``control`` the same loop without
the door (receive, run, delete; SIGTERM's default action kills it). Both print one JSON line
per received batch (the actions, or "received" for the control) and one per body start."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import boto3
from effects import record_effect, record_start

import idempotent_job
from idempotent_job.sqs import Consumer

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["door", "control"])
parser.add_argument("url")
parser.add_argument("scenario")
parser.add_argument("--lease", type=float, default=60)
parser.add_argument("--on-stale", default="reclaim")
parser.add_argument("--sleep", type=float, default=0, help="seconds each body runs")
parser.add_argument("--first-sleep", type=float, default=0, help="seconds the first start of a key runs")
parser.add_argument("--effect-first", action="store_true", help="the effect before the sleep")
parser.add_argument("--raise-first", action="store_true", help="the first start of a key raises")
parser.add_argument("--max", type=int, default=10)
args = parser.parse_args()

sqs = boto3.client(
    "sqs",
    endpoint_url=f"http://127.0.0.1:{os.environ.get('MOTO_PORT', '25458')}",
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)


def say(**what) -> None:
    print(json.dumps(dict(what, pid=os.getpid())), flush=True)


def body(order_id: str, receives: int) -> str:
    starts = record_start(args.scenario, order_id)
    say(start=order_id, receives=receives)
    if args.effect_first:
        record_effect(args.scenario, order_id)
    if starts == 1:
        time.sleep(args.first_sleep)
        if args.raise_first:
            raise RuntimeError(f"the first run of {order_id} fails")
    time.sleep(args.sleep)
    if not args.effect_first:
        record_effect(args.scenario, order_id)
    return order_id


class Reporting(Consumer):
    def poll(self) -> list[str]:
        actions = super().poll()
        if actions:
            say(actions=actions)
        return actions


if args.mode == "door":
    idempotent_job.configure()
    consumer = Reporting(
        args.url,
        lambda message, claim: body(message.body["order_id"], message.receive_count),
        job_type="SqsOrder",
        key="body.order_id",
        client=sqs,
        max_messages=args.max,
        wait_seconds=1,
        lease=args.lease,
        on_stale=args.on_stale,
    )
    say(ready=True)
    consumer.run()
    say(stopped=True)
    sys.exit(0)

say(ready=True)
while True:
    answer = sqs.receive_message(
        QueueUrl=args.url, MaxNumberOfMessages=args.max, WaitTimeSeconds=1, AttributeNames=["All"]
    )
    messages = answer.get("Messages", [])
    if messages:
        say(actions=["received"] * len(messages))
    for message in messages:
        try:
            body(
                json.loads(message["Body"])["order_id"], int(message["Attributes"]["ApproximateReceiveCount"])
            )
        except RuntimeError:
            continue  # left for redelivery
        sqs.delete_message(QueueUrl=args.url, ReceiptHandle=message["ReceiptHandle"])
