"""One worker process of the ceiling section (``bin/bench --only ceiling``): THREADS threads
drive deliveries with no job body as fast as one PostgreSQL answers, for SECONDS, and print
``{"ops": N, "seconds": S}`` as JSON.

    .venv/bin/python bench/ceiling_worker.py door|guard PREFIX THREADS SECONDS

Every fourth delivery repeats an operation this thread finished earlier (a duplicate);
the rest are new operations (claim + completion). ``door``: ``idempotent_job.perform_once``
(pool of THREADS connections); ``guard``: a hand-written psycopg guard on a narrow table of
its own (``INSERT … ON CONFLICT DO NOTHING RETURNING``, ``UPDATE`` to done; a duplicate
reads its row), one connection per thread, durable commits.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import idempotent_job
import psycopg

TABLE = "bench_ceiling_guard"


def guard_loop(prefix, thread, stop, counts):
    conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    done = []
    n = 0
    while not stop.is_set():
        if done and n % 4 == 3:
            key = done[n % len(done)]
            conn.execute(f"SELECT done FROM {TABLE} WHERE key = %s", (key,), prepare=True).fetchone()
        else:
            key = f"{prefix}-{thread}-{n}"
            won = conn.execute(
                f"INSERT INTO {TABLE} (key, token, lease_until) VALUES (%s, gen_random_uuid(), "
                "now() + interval '300 seconds') ON CONFLICT DO NOTHING RETURNING token",
                (key,),
                prepare=True,
            ).fetchone()
            if won:
                conn.execute(
                    f"UPDATE {TABLE} SET done = true, completed_at = now() WHERE key = %s AND token = %s",
                    (key, won[0]),
                    prepare=True,
                )
                done.append(key)
        n += 1
    counts[thread] = n
    conn.close()


def door_loop(prefix, thread, stop, counts):
    done = []
    n = 0
    while not stop.is_set():
        if done and n % 4 == 3:
            key = done[n % len(done)]
        else:
            key = f"{prefix}-{thread}-{n}"
        outcome = idempotent_job.perform_once("CeilingJob", key, lambda claim: None)
        if outcome.decision == "ran":
            done.append(key)
        n += 1
    counts[thread] = n


def main():
    mode, prefix, threads, seconds = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    if mode == "door":
        idempotent_job.configure(pool_size=threads)
    loop = door_loop if mode == "door" else guard_loop
    stop = threading.Event()
    counts = [0] * threads
    workers = [threading.Thread(target=loop, args=(prefix, t, stop, counts)) for t in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    print(json.dumps({"ops": sum(counts), "seconds": time.monotonic() - started}))


if __name__ == "__main__":
    main()
