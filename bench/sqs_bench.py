"""The SQS benchmark (issue 33), run by ``bin/bench --only sqs`` or on its own:

    .venv/bin/python bench/sqs_bench.py --operations 1000 --rounds 3 [--json OUT]

Against moto's server mode (``moto_server``, an SQS *emulator*: its HTTP round trips, not
AWS's, set the pace), one consumer drains a queue of N messages plus 30 % duplicates
(batches of 10, long polling off) with the door (``idempotent_job.sqs.Consumer.poll``)
and with a hand-written psycopg guard in the same loop (``INSERT … ON CONFLICT DO NOTHING
RETURNING``, the effect, ``UPDATE`` to done, ``DeleteMessage``), each on a queue of its own,
batch by batch in turn (so the machine's load falls on both); throughput is messages per
second, the ratio door / guard per round, the median printed (target ≥ 0.95). Needs
DATABASE_URL; starts moto_server on MOTO_PORT (default 25458) + 1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid

import boto3
import idempotent_job
import psycopg
from idempotent_job.sqs import Consumer

GUARD_TABLE = "bench_sqs_guard"


def fill(sqs, url, operations, run):
    keys = [f"{run}-{n}" for n in range(operations)]
    sends = keys + random.Random(33).choices(keys, k=int(operations * 0.3))
    for start in range(0, len(sends), 10):
        entries = [
            {"Id": str(n), "MessageBody": json.dumps({"order_id": key, "cents": 500})}
            for n, key in enumerate(sends[start : start + 10])
        ]
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    return len(sends)


def door_batch(consumer):
    """One batch through the door: the messages it handled."""
    return len(consumer.poll())


def guard_batch(sqs, url, effects, conn):
    """One batch through the hand-written guard, in the door's loop shape: the messages handled."""
    answer = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, AttributeNames=["All"]
    )
    messages = answer.get("Messages", [])
    for message in messages:
        key = json.loads(message["Body"])["order_id"]
        claimed = conn.execute(
            f"INSERT INTO {GUARD_TABLE} (operation_key, status, claimed_at) "
            "VALUES (%s, 'running', now()) ON CONFLICT DO NOTHING RETURNING 1",
            (key,),
            prepare=True,
        ).fetchone()
        if claimed is not None:
            effects.append(key)
            conn.execute(
                f"UPDATE {GUARD_TABLE} SET status = 'done', completed_at = now() WHERE operation_key = %s",
                (key,),
                prepare=True,
            )
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return len(messages)


def one_round(sqs, conn, operations, round_):
    """Fills a queue per variant, then drains both batch by batch, alternating (which goes
    first alternates too), so the machine's load falls on both; returns msg/s per variant."""
    run = uuid.uuid4().hex[:10]
    urls = {v: sqs.create_queue(QueueName=f"bench-{v}-{run}")["QueueUrl"] for v in ("door", "guard")}
    messages = {v: fill(sqs, urls[v], operations, f"{run}-{v}") for v in urls}
    effects: dict[str, list[str]] = {"door": [], "guard": []}
    consumer = Consumer(
        urls["door"],
        lambda message, claim: effects["door"].append(claim.operation_key),
        job_type="BenchSqs",
        key="body.order_id",
        client=sqs,
        wait_seconds=0,
        lease=60,
    )
    batches = {
        "door": lambda: door_batch(consumer),
        "guard": lambda: guard_batch(sqs, urls["guard"], effects["guard"], conn),
    }
    done = {"door": 0, "guard": 0}
    seconds = {"door": 0.0, "guard": 0.0}
    turn = 0
    while any(done[v] < messages[v] for v in done):
        order = ["door", "guard"] if (turn + round_) % 2 == 0 else ["guard", "door"]
        turn += 1
        for variant in order:
            if done[variant] < messages[variant]:
                started = time.perf_counter()
                done[variant] += batches[variant]()
                seconds[variant] += time.perf_counter() - started
    for variant, url in urls.items():
        assert len(effects[variant]) == operations, (variant, len(effects[variant]))
        sqs.delete_queue(QueueUrl=url)
    return {v: messages[v] / seconds[v] for v in urls}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--operations", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    port = int(os.environ.get("MOTO_PORT", "25458")) + 1
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port), "-H", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sqs = boto3.client(
            "sqs",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        for _ in range(300):
            try:
                sqs.list_queues()
                break
            except Exception:
                time.sleep(0.1)
        idempotent_job.configure()
        idempotent_job.migrate()
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {GUARD_TABLE} (operation_key text PRIMARY KEY, status text, "
            "claimed_at timestamptz, completed_at timestamptz)"
        )
        rows, ratios = [], []
        for round_ in range(-1, args.rounds):  # round -1 warms both variants up, untimed
            rates = one_round(sqs, conn, 20 if round_ < 0 else args.operations, round_)
            if round_ < 0:
                continue
            ratios.append(rates["door"] / rates["guard"])
            rows.append([round_, round(rates["door"]), round(rates["guard"]), round(ratios[-1], 3)])
            print(
                f"round {round_}: door {rates['door']:.0f} msg/s, hand-written psycopg guard "
                f"{rates['guard']:.0f} msg/s: {ratios[-1]:.3f}x"
            )
        figures = {
            "operations": args.operations,
            "messages": int(args.operations * 1.3),
            "rows": rows,
            "ratio": statistics.median(ratios),
            "target": 0.95,
        }
        print(json.dumps(figures))
        if args.json:
            with open(args.json, "w") as out:
                json.dump(figures, out)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
