"""The raw-SQL floor on PostgreSQL: psycopg 3 and four statements, no sqlbroker.

The least a durable SKIP LOCKED queue has to do: insert (with a NOTIFY in the same
statement), batch-claim with ``UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED
LIMIT n) RETURNING``, and batch-ack with ``DELETE … WHERE id = ANY(…)``. No archive, no
lease token, no priorities, no routing, no retries: sqlbroker ÷ floor is what those cost.
Payloads are JSON-encoded and decoded in Python as sqlbroker does.

Each publish takes the fastest raw path psycopg offers (issue 24 item 8): a single send is
one prepared statement per transaction (a pipeline saves nothing when each send waits for
its own commit); a batch is measured both as ``INSERT … SELECT FROM unnest(array)`` (one
statement, binary parameters) and as a binary ``COPY`` plus the NOTIFY in one transaction,
each on its own fresh table, and the faster of the two is the floor's rate (COPY, by
~1.5× here: PostgreSQL inserts COPY's rows a page at a time, ``INSERT … SELECT`` a row at a
time).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from harness import QUEUE, BenchError, Consumer, Database, Sample, Sizes, emit, payload, percentile
from workloads import BACKLOGS

from systems.peer_common import encode, timed_single
from systems.sqlbroker_system import IDLE_SETTLE, call_timings, latency_sample, publish_paced

NAME = "floor"
BACKENDS = ("postgresql",)
CHANNEL = "floor_job"

SCHEMA = """
CREATE TABLE floor_job (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL,
    payload     bytea NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    attempts    integer NOT NULL DEFAULT 0,
    claimed_at  timestamptz
);
CREATE INDEX floor_job_ready ON floor_job (queue, id) WHERE claimed_at IS NULL;
"""

INSERT_ONE = """
WITH i AS (INSERT INTO floor_job (queue, payload) VALUES (%(queue)s, %(payload)s) RETURNING 1)
SELECT pg_notify('floor_job', %(queue)s) FROM i
"""

INSERT_MANY = """
WITH i AS (
    INSERT INTO floor_job (queue, payload)
    SELECT %(queue)s, p FROM unnest(%(payloads)s::bytea[]) AS p
    RETURNING 1
)
SELECT pg_notify('floor_job', %(queue)s) WHERE EXISTS (SELECT FROM i)
"""

CLAIM = """
UPDATE floor_job SET claimed_at = now(), attempts = attempts + 1
WHERE id IN (
    SELECT id FROM floor_job
    WHERE queue = %(queue)s AND claimed_at IS NULL
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, payload
"""

ACK = "DELETE FROM floor_job WHERE id = ANY(%(ids)s)"

COPY_MANY = "COPY floor_job (queue, payload) FROM STDIN (FORMAT BINARY)"


@dataclass(frozen=True)
class FloorSql:
    """The floor's schema and statements; ``bench/floor_costs.py`` adds sqlbroker's durable
    state to them piece by piece. An insert takes ``queue`` and ``payload`` (``payloads``);
    a claim returns ``(id, payload)``, then optionally a lease token the ack gets back as
    ``tokens``."""

    schema: str = SCHEMA
    table: str = "floor_job"
    insert_one: str = INSERT_ONE
    insert_many: str = INSERT_MANY
    claim: str = CLAIM
    ack: str = ACK
    copy_many: str | None = None
    """A binary ``COPY`` of the rows ``copy_row`` makes (``None``: the batch publish is
    measured through ``insert_many`` only)."""
    copy_types: tuple[str, ...] = ("text", "bytea")
    copy_row: Callable[[str, bytes], tuple[Any, ...]] = lambda queue, body: (queue, body)
    notify: str = "SELECT pg_notify('floor_job', %(queue)s)"


FLOOR = FloorSql(copy_many=COPY_MANY)


def connect(database: Database) -> psycopg.Connection[Any]:
    return psycopg.connect(database.conninfo, autocommit=True)


def create_schema(database: Database, sql: FloorSql = FLOOR) -> None:
    with connect(database) as conn:
        conn.execute(sql.schema)


def _count(database: Database, table: str = FLOOR.table) -> int:
    with connect(database) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def prepublish(database: Database, count: int, sql: FloorSql = FLOOR) -> None:
    create_schema(database, sql)
    with connect(database) as conn:
        for start in range(0, count, 1000):
            size = min(1000, count - start)
            conn.execute(
                sql.insert_many,
                {"queue": QUEUE, "payloads": [encode(payload(start + i)) for i in range(size)]},
            )
        conn.execute("ANALYZE floor_job")


# --- publish ---------------------------------------------------------------------------------


def publish_single_with(sql: FloorSql) -> Callable[[Database, Sizes], Sample]:
    def publish_single(database: Database, sizes: Sizes) -> Sample:
        create_schema(database, sql)
        with connect(database) as conn:
            sample = timed_single(
                lambda i: conn.execute(
                    sql.insert_one, {"queue": QUEUE, "payload": encode(payload(i))}, prepare=True
                ),
                sizes,
            )
        if _count(database, sql.table) != sizes.warmup + sizes.publish_single:
            raise BenchError("floor: wrong row count after publishing")
        return sample

    return publish_single


def _insert_unnest(sql: FloorSql) -> Callable[[psycopg.Connection[Any], list[bytes]], None]:
    def send(conn: psycopg.Connection[Any], bodies: list[bytes]) -> None:
        conn.execute(sql.insert_many, {"queue": QUEUE, "payloads": bodies}, binary=True)

    return send


def _insert_copy(sql: FloorSql) -> Callable[[psycopg.Connection[Any], list[bytes]], None]:
    assert sql.copy_many is not None
    statement, types, row = sql.copy_many, list(sql.copy_types), sql.copy_row

    def send(conn: psycopg.Connection[Any], bodies: list[bytes]) -> None:
        with conn.transaction():
            with conn.cursor().copy(statement) as copy:
                copy.set_types(types)
                for body in bodies:
                    copy.write_row(row(QUEUE, body))
            conn.execute(sql.notify, {"queue": QUEUE}, prepare=True)

    return send


_batch_runs = 0
"""How many batch publishes ran in this process: the two methods swap order each time."""


def publish_batch_with(
    sql: FloorSql, only: str | None = None
) -> Callable[[Database, Sizes], Sample]:
    """Each method on a fresh table in the same database; ``rate`` is the faster one's.
    ``only``: just that method (``unnest`` or ``copy``)."""

    methods = {"unnest": _insert_unnest(sql)}
    if sql.copy_many is not None:
        methods["copy"] = _insert_copy(sql)
    if only is not None:
        methods = {only: methods[only]}

    def run_one(
        database: Database,
        sizes: Sizes,
        send: Callable[[psycopg.Connection[Any], list[bytes]], None],
        first: bool,
    ) -> tuple[int, float]:
        if first:
            create_schema(database, sql)
        with connect(database) as conn:
            if not first:  # a new, empty table and indexes (new files), as a fresh one
                conn.execute(f"TRUNCATE {sql.table}")
            send(conn, [encode(payload(i)) for i in range(sizes.warmup)])
            batches = sizes.publish_batch // sizes.batch_size
            started = time.perf_counter()
            for b in range(batches):
                base = b * sizes.batch_size
                send(conn, [encode(payload(base + i)) for i in range(sizes.batch_size)])
            elapsed = time.perf_counter() - started
        sent = batches * sizes.batch_size
        if _count(database, sql.table) != sizes.warmup + sent:
            raise BenchError("floor: wrong row count after publishing")
        return sent, elapsed

    def publish_batch(database: Database, sizes: Sizes) -> Sample:
        global _batch_runs
        _batch_runs += 1
        order = list(methods) if _batch_runs % 2 else list(reversed(methods))
        rates: dict[str, float] = {}
        for name in order:
            sent, elapsed = run_one(database, sizes, methods[name], first=not rates)
            rates[name] = sent / elapsed
        best = max(rates, key=rates.__getitem__)
        return Sample(
            {"rate": rates[best]},
            {
                "messages": sent,
                "batch_size": sizes.batch_size,
                "method": best,
                **{f"{name}_rate": round(rate, 1) for name, rate in rates.items()},
            },
        )

    return publish_batch


publish_batch = publish_batch_with(FLOOR)


# --- drain -----------------------------------------------------------------------------------


def drain_claim(batch: int, sql: FloorSql = FLOOR) -> Callable[[Database, Sizes], Sample]:
    def drain(database: Database, sizes: Sizes) -> Sample:
        prepublish(database, sizes.drain, sql)
        consumed: list[int] = []
        errors: list[BaseException] = []
        timings: dict[str, list[float]] = {"claim": [], "complete": []}
        gate = threading.Barrier(sizes.drain_threads + 1)
        connections = [connect(database) for _ in range(sizes.drain_threads)]

        def loop(conn: psycopg.Connection[Any]) -> None:
            mine: list[int] = []
            claim_s: list[float] = []
            complete_s: list[float] = []
            try:
                gate.wait()
                while True:
                    started = time.perf_counter()
                    rows = conn.execute(sql.claim, {"queue": QUEUE, "limit": batch}).fetchall()
                    for row in rows:
                        json.loads(row[1])
                    claim_s.append(time.perf_counter() - started)
                    if not rows:
                        break
                    ids = [row[0] for row in rows]
                    tokens = [row[2] for row in rows] if len(rows[0]) > 2 else None
                    started = time.perf_counter()
                    conn.execute(sql.ack, {"ids": ids, "tokens": tokens})
                    complete_s.append(time.perf_counter() - started)
                    mine += ids
            except BaseException as error:
                errors.append(error)
            consumed.extend(mine)
            timings["claim"] += claim_s
            timings["complete"] += complete_s

        threads = [threading.Thread(target=loop, args=(c,)) for c in connections]
        for thread in threads:
            thread.start()
        gate.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        for conn in connections:
            conn.close()
        if errors:
            raise BenchError(f"a floor consumer thread failed: {errors[0]!r}")
        if len(consumed) != sizes.drain or len(set(consumed)) != sizes.drain:
            raise BenchError(f"floor: consumed {len(consumed)} ({len(set(consumed))} distinct)")
        if _count(database):
            raise BenchError("floor: rows left after draining")
        return Sample(
            {"rate": sizes.drain / elapsed},
            {
                "messages": sizes.drain,
                "seconds": round(elapsed, 3),
                "threads": sizes.drain_threads,
                "claim_limit": batch,
                **call_timings(timings),
            },
        )

    return drain


# --- scale (W4) ------------------------------------------------------------------------------


def claim_backlog(count: int) -> Callable[[Database, Sizes], Sample]:
    """The time of one claim of 10 with ``count`` rows waiting (acked before the next)."""

    def run(database: Database, sizes: Sizes) -> Sample:
        prepublish(database, count)
        claim_s: list[float] = []
        seen: set[int] = set()
        with connect(database) as conn:
            for round_ in range(sizes.warmup + sizes.claim_samples):
                started = time.perf_counter()
                rows = conn.execute(CLAIM, {"queue": QUEUE, "limit": 10}).fetchall()
                for _, body in rows:
                    json.loads(body)
                if round_ >= sizes.warmup:
                    claim_s.append(time.perf_counter() - started)
                if len(rows) != 10:
                    raise BenchError(f"floor: claimed {len(rows)} of 10 with a backlog")
                conn.execute(ACK, {"ids": [row[0] for row in rows]})
                seen.update(row[0] for row in rows)
        if len(seen) != 10 * (sizes.warmup + sizes.claim_samples):
            raise BenchError("floor: a row was claimed twice")
        return Sample(
            {"p50": percentile(claim_s, 0.5) * 1000, "p99": percentile(claim_s, 0.99) * 1000},
            {"backlog": count, "claims": len(claim_s)},
        )

    return run


# --- latency ---------------------------------------------------------------------------------


def latency_with(sql: FloorSql) -> Callable[[Database, Sizes], Sample]:
    """The latency loop with ``sql``'s statements: the consumer process is handed the claim
    and the ack as options when they are not the floor's own."""

    def latency(database: Database, sizes: Sizes) -> Sample:
        create_schema(database, sql)
        count = int(sizes.latency_rate * sizes.latency_seconds)
        with connect(database) as conn:

            def send(i: int) -> None:
                conn.execute(sql.insert_one, {"queue": QUEUE, "payload": encode(payload(i))})

            conn.execute(sql.insert_one, {"queue": QUEUE, "payload": encode({"warmup": True})})
            args = [NAME, "latency", "--url", database.url, "--expect", str(count)]
            if sql.claim != CLAIM or sql.ack != ACK:
                args += ["--option", f"claim={sql.claim}", "--option", f"ack={sql.ack}"]
            with Consumer(*args, timeout=sizes.latency_seconds + 60) as consumer:
                consumer.read_event("ready")
                time.sleep(IDLE_SETTLE)
                paced = publish_paced(send, rate=sizes.latency_rate, seconds=sizes.latency_seconds)
                done = consumer.finish()
        return latency_sample(done["arrivals"], paced)

    return latency


latency = latency_with(FLOOR)


def runs_on(workload: str, target: str) -> bool:
    """The backlog claims (W4) run on the durable target only, as sqlbroker's do."""
    return target == "postgresql" or not workload.startswith("claim.backlog.")


ONE_METHOD: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.batch.unnest": publish_batch_with(FLOOR, "unnest"),
    "publish.batch.copy": publish_batch_with(FLOOR, "copy"),
}
"""Each batch path alone (``bench/pgprofile.py --system floor``, ``bench/floor_costs.py``)."""

WORKLOADS: dict[str, Callable[[Database, Sizes], Sample]] = {
    "publish.single": publish_single_with(FLOOR),
    "publish.batch": publish_batch,
    "drain.claim10": drain_claim(10),
    "drain.claim100": drain_claim(100),
    "latency": latency,
    **{f"claim.backlog.{label}": claim_backlog(n) for n, label in BACKLOGS.items()},
}


# --- the consumer process --------------------------------------------------------------------


def consume(args: argparse.Namespace) -> None:
    """One LISTENing connection for wake-ups, one for work; claim until empty, then wait for
    a notification (or a 1 s poll)."""
    if args.mode != "latency":
        raise SystemExit(f"the floor has no {args.mode!r} consumer")
    options = dict(option.split("=", 1) for option in args.option)
    claim, ack = options.get("claim", CLAIM), options.get("ack", ACK)
    arrivals: list[tuple[int, float, float]] = []
    deadline = time.monotonic() + args.timeout
    with (
        psycopg.connect(args.url, autocommit=True) as listener,
        psycopg.connect(args.url, autocommit=True) as conn,
    ):
        listener.execute(f"LISTEN {CHANNEL}")
        while len(arrivals) < args.expect and time.monotonic() < deadline:
            rows = conn.execute(claim, {"queue": QUEUE, "limit": 10}).fetchall()
            if not rows:
                for _ in listener.notifies(timeout=1.0, stop_after=1):
                    pass
                continue
            for _, data, *_token in rows:
                now = time.time()
                body = json.loads(data)
                if body.get("warmup"):
                    emit("ready")
                else:
                    arrivals.append((body["seq"], body["t"], now))
            tokens = [row[2] for row in rows] if len(rows[0]) > 2 else None
            conn.execute(ack, {"ids": [row[0] for row in rows], "tokens": tokens})
    emit("done", arrivals=arrivals)
