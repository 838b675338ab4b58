"""What two checks of issue 23 cost on PostgreSQL, measured in one run (before = the check
switched off, after = on; pairs of short rounds in alternating order, so that drift hits
both alike; prints the medians and the median of the per-pair ratios):

- ``broker.claim`` -> ``complete`` with the claim's take-back of expired leases (at most
  one sweep a second per broker), at batch sizes 1, 10 and 100; and one sweep's own cost;
- ``publish(conn=caller)`` in the caller's transaction with the same-database check (one
  identity query per caller connection object, then a dictionary lookup).

    .venv/bin/python bench/issue23_costs.py [--pairs 20] [--messages 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import psycopg

import sqlbroker
from pgserver import PostgresServer
from sqlbroker.client import consuming
from sqlbroker.storage.postgres.joining import CallerConnections


def _pairs(pairs: int, round_of: Callable[[bool], float]) -> tuple[float, float, float]:
    before, after, ratios = [], [], []
    for index in range(pairs):
        order = (False, True) if index % 2 == 0 else (True, False)
        rates = {on: round_of(on) for on in order}
        before.append(rates[False])
        after.append(rates[True])
        ratios.append(rates[True] / rates[False])
    return statistics.median(before), statistics.median(after), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--messages", type=int, default=300)
    args = parser.parse_args()
    count = args.messages
    take_back_due = consuming._take_back_due
    same_database = CallerConnections._check_same_database

    def claims(broker: sqlbroker.Broker, limit: int, on: bool) -> float:
        never: Any = lambda broker: False  # noqa: E731
        consuming._take_back_due = take_back_due if on else never
        try:
            broker.send_many("jobs", list(range(count)))
            started, done = time.perf_counter(), 0
            while done < count:
                got = broker.claim("jobs", limit=limit)
                broker.complete(got)
                done += len(got)
            return count / (time.perf_counter() - started)
        finally:
            consuming._take_back_due = take_back_due

    def publishes(broker: sqlbroker.Broker, conn: Any, on: bool) -> float:
        off: Any = lambda self, raw: None  # noqa: E731
        CallerConnections._check_same_database = same_database if on else off  # type: ignore[method-assign]
        try:
            started = time.perf_counter()
            for number in range(count):
                with conn.transaction():
                    broker.publish("orders.created", {"order": number}, conn=conn)
            return count / (time.perf_counter() - started)
        finally:
            CallerConnections._check_same_database = same_database  # type: ignore[method-assign]

    with PostgresServer() as server:
        server.create_database("bench")
        url = server.url("bench")
        with sqlbroker.Broker(url, migrate=True) as broker:
            broker.subscribe("billing", "orders.#")
            for limit in (1, 10, 100):
                before, after, ratio = _pairs(
                    args.pairs, lambda on, limit=limit: claims(broker, limit, on)
                )
                print(
                    f"claim+complete limit={limit:3d}: before {before:7.0f}/s"
                    f"  after {after:7.0f}/s  median pair ratio {ratio:.3f}"
                )
            sweeps = []
            for _ in range(200):
                started = time.perf_counter()
                broker.backend.lease_release_expired(limit=consuming.TAKE_BACK_BATCH)
                sweeps.append(time.perf_counter() - started)
            print(
                f"one take-back sweep, nothing expired: {1000 * statistics.median(sweeps):.2f} ms"
            )
            with psycopg.connect(url, autocommit=True) as conn:
                before, after, ratio = _pairs(args.pairs, lambda on: publishes(broker, conn, on))
                print(
                    f"publish(conn=) in the caller's transaction: before {before:6.0f}/s"
                    f"  after {after:6.0f}/s  median pair ratio {ratio:.3f}"
                )


if __name__ == "__main__":
    main()
