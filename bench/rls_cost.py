"""What tenant isolation (row-level security) costs on the hot path, measured in one run.

A throwaway PostgreSQL server; two tenants, each with a backlog in its own queue; the same
tenant login claims and completes batches (and sends single messages) with isolation off and
on, alternating rounds so that drift hits both alike. Prints medians per operation.

    .venv/bin/python bench/rls_cost.py [--backlog 20000] [--rounds 6] [--ops 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tenants_setup import two_tenants

import sqlbroker
from pgserver import PostgresServer
from sqlbroker.features import security


def _timed(operation: object, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        operation()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--generic", action="store_true")
    args = parser.parse_args()
    with PostgresServer() as pg:
        admin_url, urls = two_tenants(pg, generic_plans=args.generic)
        admin = sqlbroker.Broker(admin_url)
        acme = sqlbroker.Broker(urls["acme"])
        globex = sqlbroker.Broker(urls["globex"])
        for broker, queue in ((acme, "acme-jobs"), (globex, "globex-jobs")):
            for start in range(0, args.backlog, 1000):
                broker.send_many(queue, list(range(start, start + 1000)))
        results: dict[tuple[str, str], list[float]] = {}

        def claim_complete() -> None:
            acme.complete(acme.claim("acme-jobs", limit=10))

        def send() -> None:
            acme.send("acme-jobs", {"n": 1})

        for round_number in range(args.rounds):
            for mode in ("off", "on") if round_number % 2 == 0 else ("on", "off"):
                (security.enable_tenants if mode == "on" else security.disable_tenants)(
                    admin.backend
                )
                results.setdefault(("claim+complete x10", mode), []).extend(
                    _timed(claim_complete, args.ops)
                )
                results.setdefault(("send x1", mode), []).extend(_timed(send, args.ops))
        for name in ("claim+complete x10", "send x1"):
            off = statistics.median(results[(name, "off")]) * 1000
            on = statistics.median(results[(name, "on")]) * 1000
            print(f"{name:20s} RLS off {off:7.3f} ms   RLS on {on:7.3f} ms   ratio {on / off:5.2f}")
        for broker in (acme, globex, admin):
            broker.close()


if __name__ == "__main__":
    main()
