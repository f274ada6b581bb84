"""The hot row's cost per column (issue 31 item 1): a focused pgbench probe.

Runs a first delivery (the core's DELIVER_SQL first-claim shape, then COMPLETE_SQL's
shape; each its own transaction, prepared, two clients) against copies of
idempotent_job_records (same columns, indexes and fillfactor: ``LIKE … INCLUDING
ALL``), each copy written with one group of cold columns left NULL, and the
hand-written guard's table (bench/sidekiq_guard.rb's), in interleaved rounds of one
run. Prints, per variant and round, WAL bytes per operation (the insert position
around the batch, commits included) and pgbench's latency; then per statement the
server execution and WAL (pg_stat_statements, every round), the HOT ratio
(n_tup_hot_upd / n_tup_upd) and the average row size; ``uptime`` before each round.

Variants: ``full`` (today's row: stored job, first_facts, 64-hex text digest,
job_classes), ``nofacts`` (first_facts NULL), ``nojob`` (job_class/queue/args NULL),
``bindig`` (a 32-byte bytea digest instead of the text one), ``narrow`` (all of
those, job_classes left empty), ``guard``.

Usage: ``python3 bench/row_probe.py DATABASE_URL [ROUNDS] [OPS_PER_CLIENT]``; needs
pgbench and psql on PATH, pg_stat_statements preloaded, the schema migrated. It
creates and drops tables named p_* in that database; run it on a throwaway server.
"""

import os
import subprocess
import sys
import tempfile

FACTS = (
    '{"jid": "0f3c9a1b2d4e5f60718293a4", "retry_count": 0, '
    '"enqueued_at": 1733400000.123, "producer": "app/controllers/orders_controller.rb:42"}'
)
ARGS = '[4242, "usd", {"order": "A-10045"}]'
TOKEN = "lpad(to_hex(:k::bigint), 32, '0')::uuid"
HEX = "encode(sha256(:k::text::bytea), 'hex')"
BIN = "sha256(:k::text::bytea)"
VARIANTS = ["full", "nofacts", "nojob", "bindig", "narrow", "guard"]

SETUP = """
DROP TABLE IF EXISTS p_full, p_nofacts, p_nojob, p_bindig, p_narrow, p_guard;
CREATE TABLE p_full (LIKE idempotent_job_records INCLUDING ALL) WITH (fillfactor = 80);
CREATE TABLE p_nofacts (LIKE idempotent_job_records INCLUDING ALL) WITH (fillfactor = 80);
CREATE TABLE p_nojob (LIKE idempotent_job_records INCLUDING ALL) WITH (fillfactor = 80);
CREATE TABLE p_bindig (LIKE idempotent_job_records INCLUDING ALL) WITH (fillfactor = 80);
ALTER TABLE p_bindig ADD COLUMN args_digest_b bytea;
CREATE TABLE p_narrow (LIKE idempotent_job_records INCLUDING ALL) WITH (fillfactor = 80);
ALTER TABLE p_narrow ADD COLUMN args_digest_b bytea;
CREATE TABLE p_guard (job_type text NOT NULL, operation_key text NOT NULL, token uuid NOT NULL,
  locked_until timestamptz NOT NULL, completed_at timestamptz,
  PRIMARY KEY (job_type, operation_key));
"""

GUARD = f"""INSERT INTO p_guard (job_type, operation_key, token, locked_until) \
VALUES ('ChargeJob', :k::text, {TOKEN}, now() + make_interval(secs => 300)) \
ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING token;
UPDATE p_guard SET completed_at = now() \
WHERE job_type = 'ChargeJob' AND operation_key = :k::text AND token = {TOKEN};
"""


def delivery(table, facts, job, digest_col, digest, classes):
    """The pgbench script of one first delivery into ``table``.

    facts/job/classes (bool): write first_facts / the stored job / job_classes;
    digest_col, digest: the digest's column and its SQL expression. Returns text.
    """
    job_class, queue, args = ("'ChargeJob'", "'default'", f"'{ARGS}'") if job else ("NULL",) * 3
    first_facts = f"'{FACTS}'::jsonb" if facts else "NULL::jsonb"
    job_classes = "ARRAY['ChargeJob']" if classes else "'{}'::text[]"
    returned = f"status, jid, attempts, duplicates, {digest_col}"
    return f"""WITH look AS (SELECT {returned}, lease_expires_at, claim_token = {TOKEN} AS mine, \
last_claim, result::text AS result, result_state FROM {table} \
WHERE job_type = 'ChargeJob' AND operation_key = :k::text), \
first AS (INSERT INTO {table} (job_type, operation_key, status, claim_token, jid, lease_seconds, \
lease_expires_at, {digest_col}, job_class, queue, args, job_classes, first_facts) \
SELECT 'ChargeJob', :k::text, 'claimed', {TOKEN}, to_hex(:k::bigint), 300, \
now() + make_interval(secs => 300), {digest}, {job_class}, {queue}, {args}::jsonb, {job_classes}, \
{first_facts} WHERE NOT EXISTS (SELECT 1 FROM look) \
ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING {returned}, lease_expires_at) \
SELECT true AS inserted, {returned}, EXTRACT(EPOCH FROM lease_expires_at - now())::float8 FROM first \
UNION ALL SELECT false, {returned}, EXTRACT(EPOCH FROM lease_expires_at - now())::float8 FROM look;
UPDATE {table} SET status = 'completed', \
completed_at = CASE WHEN status = 'completed' THEN completed_at ELSE clock_timestamp() END, \
result = NULL::text::jsonb, result_state = NULL::text, updated_at = now() \
WHERE job_type = 'ChargeJob' AND operation_key = :k::text AND claim_token = {TOKEN} \
AND status IN ('claimed', 'completed');
"""


def scripts():
    """Every variant's pgbench script text, by variant name (dict)."""
    return {
        "full": delivery("p_full", True, True, "args_digest", HEX, True),
        "nofacts": delivery("p_nofacts", False, True, "args_digest", HEX, True),
        "nojob": delivery("p_nojob", True, False, "args_digest", HEX, True),
        "bindig": delivery("p_bindig", True, True, "args_digest_b", BIN, True),
        "narrow": delivery("p_narrow", False, False, "args_digest_b", BIN, False),
        "guard": GUARD,
    }


def psql(url, sql):
    """Runs ``sql`` with psql on ``url``; returns its unaligned output (str)."""
    out = subprocess.run(["psql", url, "-Atqc", sql], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def pgbench(url, path, ops):
    """Runs ``ops`` first deliveries per client (2 clients) of the script at ``path``.

    Returns pgbench's average latency in ms (str).
    """
    out = subprocess.run(
        ["pgbench", "-n", "-M", "prepared", "-c", "2", "-t", str(ops), "-f", path, url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return next(line.split()[3] for line in out.splitlines() if line.startswith("latency average"))


def uptime():
    """The machine's ``uptime`` line (load averages), printed with every figure (str)."""
    return subprocess.run(["uptime"], check=True, capture_output=True, text=True).stdout.strip()


def main():
    """Runs the probe (see the module's doc) and prints its figures."""
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    ops = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    psql(url, "ALTER SYSTEM SET max_wal_size = '8GB'")
    psql(url, "ALTER SYSTEM SET checkpoint_timeout = '1h'")
    psql(url, "SELECT pg_reload_conf()")
    subprocess.run(["psql", url, "-q", "-c", SETUP], check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, body in scripts().items():
            paths[name] = os.path.join(tmp, f"{name}.sql")
            with open(paths[name], "w") as f:
                f.write("\\set k random(1, 1000000000000)\n" + body)
        for name in VARIANTS:  # warm-up: prepares, fills the first pages
            pgbench(url, paths[name], 200)
        psql(url, "CHECKPOINT")
        for name in VARIANTS:  # each page touched once since the checkpoint: no FPIs below
            pgbench(url, paths[name], 200)
        psql(url, "SELECT pg_stat_statements_reset()")
        psql(url, "SELECT pg_stat_reset()")
        for r in range(1, rounds + 1):
            print(uptime())
            for name in VARIANTS:
                before = psql(url, "SELECT pg_current_wal_lsn()")
                latency = pgbench(url, paths[name], ops)
                wal = int(
                    psql(
                        url,
                        f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{before}')::bigint",
                    )
                )
                print(f"round {r} {name:8} WAL/op {wal / (2 * ops):6.0f} B  latency {latency} ms")
    print(uptime())
    print("--- per statement, every round: table | statement | calls | mean exec µs | WAL B | FPI")
    print(
        psql(
            url,
            "SELECT (regexp_match(query, 'p_[a-z]+'))[1], left(query, 12), calls, "
            "round((mean_exec_time * 1000)::numeric, 1), round(wal_bytes::numeric / calls), "
            "round(wal_fpi::numeric / calls, 3) FROM pg_stat_statements "
            "WHERE query ~ 'p_(full|nofacts|nojob|bindig|narrow|guard)' AND calls > 100 ORDER BY 1, 2",
        )
    )
    print("--- table | updates | HOT updates | HOT ratio")
    print(
        psql(
            url,
            "SELECT relname, n_tup_upd, n_tup_hot_upd, "
            "round(n_tup_hot_upd::numeric / nullif(n_tup_upd, 0), 3) FROM pg_stat_user_tables "
            "WHERE relname LIKE 'p\\_%' ORDER BY 1",
        )
    )
    for name in VARIANTS:
        size = psql(url, f"SELECT round(avg(pg_column_size(t.*))) FROM p_{name} t")
        print(f"p_{name} average row {size} B")


if __name__ == "__main__":
    main()
