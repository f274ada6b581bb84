"""One SQS consumer of the demo (examples/demo/sqs_demo.py starts two): the Python package's
SQS door (idempotent_job.sqs.Consumer) on the demo's queue in moto_server (an SQS emulator),
charging each order once into demo_charges under the job type ``demo_sqs.charge_order``.

    .venv/bin/python examples/demo/sqs_consumer.py QUEUE_URL ENDPOINT

The first start of an order listed in the Redis set ``idempotent_job_demo:sqs_stall`` hangs
before its effect (the demo SIGKILLs this process there). Stops on SIGTERM."""

from __future__ import annotations

import json
import os
import sys
import time

import boto3
import idempotent_job
import psycopg
import redis
from idempotent_job.sqs import Consumer

JOB_TYPE = "demo_sqs.charge_order"
#: The lease, seconds: short, so the killed consumer's message comes back within the demo.
LEASE = 4
STARTS_KEY = "idempotent_job_demo:sqs_starts"
STALL_KEY = "idempotent_job_demo:sqs_stall"
#: Deliveries that reached a consumer, per "job_type order_id" (the demo report's "arrived").
ARRIVALS_KEY = "idempotent_job_demo:arrivals"

_redis = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)


def charge(message, claim):
    """Charges the order once: a row in demo_charges (after 0.8 s of work, so copies overlap)."""
    order_id = message.body["order_id"]
    if _redis.hincrby(STARTS_KEY, order_id, 1) == 1 and _redis.sismember(STALL_KEY, order_id):
        _redis.hset(STARTS_KEY + ":pid", order_id, os.getpid())
        time.sleep(120)
    time.sleep(0.8)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
        c.execute(
            "INSERT INTO demo_charges (job_type, order_id, amount_cents, pid) VALUES (%s, %s, %s, %s)",
            (JOB_TYPE, order_id, message.body["amount_cents"], os.getpid()),
        )
    return {"charged": order_id, "pid": os.getpid()}


if __name__ == "__main__":
    url, endpoint = sys.argv[1:3]
    idempotent_job.configure(database_url=os.environ["DATABASE_URL"])
    client = boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="demo",
        aws_secret_access_key="demo",
    )

    def arrived(parsed, **_):
        """Counts each received message (botocore's after-call event of ReceiveMessage)."""
        for message in parsed.get("Messages", []):
            order_id = json.loads(message["Body"])["order_id"]
            _redis.hincrby(ARRIVALS_KEY, f"{JOB_TYPE} {order_id}", 1)

    client.meta.events.register("after-call.sqs.ReceiveMessage", arrived)
    Consumer(
        url, charge, job_type=JOB_TYPE, key="body.order_id", client=client, wait_seconds=1, lease=LEASE
    ).run()
