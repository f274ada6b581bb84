"""The demo's SQS scenarios, run by bin/demo with the venv's Python:

    .venv/bin/python examples/demo/sqs_demo.py

Starts moto_server (an SQS *emulator* from PyPI, not AWS; port DEMO_MOTO_PORT, default
25460) with a queue whose visibility timeout (3 s) is shorter than the bodies' runs can be,
and two consumer processes with the Python package's SQS door (examples/demo/sqs_consumer.py):

* (o) one order's message sent twice at once: both consumers receive a copy; one charges,
  the other meets its live claim and is made visible again after retry_after, then finds
  the operation completed and is deleted;
* (p) a consumer SIGKILLed inside the body, after its claim and before its effect: its
  message comes back when its visibility (extended to the lease while the body ran) ends,
  meets the dead claim, and once the lease (4 s) has run out the other consumer takes the
  stale claim over and charges.

Adds the deliveries to the demo's state file (DEMO_STATE) so the report's effects table
shows both operations. Needs DATABASE_URL and REDIS_URL. Exit status 0 when both ended in
one charge.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import psycopg
import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STATE = Path(os.environ.get("DEMO_STATE", ROOT / "tmp" / "demo" / "state.json"))
PORT = int(os.environ.get("DEMO_MOTO_PORT", "25460"))
ENDPOINT = f"http://127.0.0.1:{PORT}"
JOB_TYPE = "demo_sqs.charge_order"
TIMEOUT = 90
# The consumers' own output (the core's log lines: a takeover's warning…), kept out of the
# demo's console.
LOG = ROOT / "tmp" / "demo" / "sqs.log"


def say(text: str) -> None:
    print(text, flush=True)


def wait_for(check, what: str, within: float = TIMEOUT):
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within} s waiting for {what}")
        time.sleep(0.1)


def charges(order_id: str) -> list[int]:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
        rows = c.execute(
            "SELECT pid FROM demo_charges WHERE job_type = %s AND order_id = %s", (JOB_TYPE, order_id)
        ).fetchall()
    return [row[0] for row in rows]


def main() -> int:
    state = json.loads(STATE.read_text())
    orders = {letter: f"{state['run']}-{number}" for letter, number in (("o", 115), ("p", 116))}
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", PORT)) == 0:
            raise SystemExit(
                f"FAILED: port {PORT} is taken by another process: set DEMO_MOTO_PORT to a free port"
            )
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(PORT), "-H", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    consumers: list[subprocess.Popen] = []
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    try:
        sqs = boto3.client(
            "sqs",
            endpoint_url=ENDPOINT,
            region_name="us-east-1",
            aws_access_key_id="demo",
            aws_secret_access_key="demo",
        )

        def up():
            try:
                return sqs.list_queues() is not None
            except Exception:
                return False

        wait_for(up, "moto_server")
        # A port taken meanwhile: this moto_server exits, and another process answers in its place.
        if server.poll() is not None:
            raise SystemExit(
                f"FAILED: moto_server exited (status {server.returncode}), yet port {PORT} answers: another "
                f"process holds it; set DEMO_MOTO_PORT to a free port"
            )
        url = sqs.create_queue(QueueName=f"demo-{state['run']}", Attributes={"VisibilityTimeout": "3"})[
            "QueueUrl"
        ]
        r = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
        r.sadd("idempotent_job_demo:sqs_stall", orders["p"])

        def start():
            with LOG.open("a") as log:
                process = subprocess.Popen(
                    [sys.executable, str(HERE / "sqs_consumer.py"), url, ENDPOINT],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            consumers.append(process)
            return process

        victim = start()
        body = {"order_id": orders["p"], "amount_cents": 1500}
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
        pid = int(wait_for(lambda: r.hget("idempotent_job_demo:sqs_starts:pid", orders["p"]), "(p)'s body"))
        os.kill(pid, signal.SIGKILL)
        victim.wait()
        say(f"(p) {orders['p']}: sent once; consumer pid {pid} claimed it and was SIGKILLed inside the body")
        for _ in range(2):
            start()
        body = {"order_id": orders["o"], "amount_cents": 1500}
        for _ in range(2):
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
        paid = wait_for(lambda: charges(orders["o"]), "(o)'s charge")
        say(f"(o) {orders['o']}: the same message sent twice at once to 2 consumers: charged by pid {paid}")
        paid = wait_for(lambda: charges(orders["p"]), "(p)'s charge")
        say(
            f"(p) {orders['p']}: the message came back when its visibility ran out, met the dead claim, and "
            f"once the 4 s lease had run out the stale claim was taken over: charged by pid {paid}"
        )

        def counts():
            a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
            return a["ApproximateNumberOfMessages"], a["ApproximateNumberOfMessagesNotVisible"]

        def drained():
            # Two reads in a row: moto reads its clock once per counter, so a message whose
            # visibility ends between them counts as neither in one read.
            return counts() == ("0", "0") and counts() == ("0", "0")

        wait_for(drained, "the queue to drain")
    finally:
        for process in consumers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in consumers:
            process.wait(30)
        server.terminate()
        server.wait(10)
    deliveries = state["deliveries"]
    for letter, sends in (("o", 2), ("p", 1)):
        key = f"{JOB_TYPE} {orders[letter]}"
        deliveries[key] = deliveries.get(key, 0) + sends
    STATE.write_text(json.dumps(state, indent=2))
    say(f"sqs consumers stopped (SIGTERM: running bodies finish, polling stops; log: {LOG})")
    return 0 if len(charges(orders["o"])) == 1 and len(charges(orders["p"])) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
