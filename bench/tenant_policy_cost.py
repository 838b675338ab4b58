"""The cost of schema 9's message policies against schema 7's, measured in one run.

Schema 9 (issue 29) authorises a message by its subscription's owner only; schema 7 also let
the row's own tenant column grant access. One throwaway server, one database, two tenants
with a backlog each; the same tenant login claims and completes batches and sends single
messages under three settings switched in alternating rounds: isolation off, on with
schema 7's message policies (restored by hand), on with schema 9's. Prints medians and 10th
percentiles.

    .venv/bin/python bench/tenant_policy_cost.py [--backlog 40000] [--rounds 6] [--ops 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tenants_setup import two_tenants

import sqlbroker
from pgserver import PostgresServer
from sqlbroker.features import security

SCHEMA_7 = """
DROP POLICY sqlbroker_tenant_isolation ON sqlbroker_message;
DROP POLICY sqlbroker_tenant_insert ON sqlbroker_message;
CREATE POLICY sqlbroker_tenant_isolation ON sqlbroker_message
    USING (subscription IN (SELECT s.name FROM sqlbroker_subscription s)
           OR tenant = (SELECT sqlbroker_session_tenant()));
CREATE POLICY sqlbroker_tenant_insert ON sqlbroker_message AS RESTRICTIVE FOR INSERT
    WITH CHECK (sqlbroker_tenant_may_use(subscription));
"""

SCHEMA_9 = """
DROP POLICY sqlbroker_tenant_isolation ON sqlbroker_message;
DROP POLICY sqlbroker_tenant_insert ON sqlbroker_message;
CREATE POLICY sqlbroker_tenant_isolation ON sqlbroker_message
    USING (subscription IN (SELECT s.name FROM sqlbroker_subscription s)
           OR (tenant IS NOT DISTINCT FROM (SELECT sqlbroker_session_tenant())
               AND sqlbroker_tenant_owns(subscription)));
CREATE POLICY sqlbroker_tenant_insert ON sqlbroker_message AS RESTRICTIVE FOR INSERT
    WITH CHECK (tenant IS NOT DISTINCT FROM (SELECT sqlbroker_session_tenant())
                AND sqlbroker_tenant_owns(subscription));
"""


def _p10(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 10]


def _timed(operation: Callable[[], object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        operation()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=40000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=300)
    args = parser.parse_args()
    with PostgresServer() as pg:
        admin_url, urls = two_tenants(pg)
        admin = sqlbroker.Broker(admin_url)
        acme = sqlbroker.Broker(urls["acme"])
        globex = sqlbroker.Broker(urls["globex"])
        for broker, queue in ((acme, "acme-jobs"), (globex, "globex-jobs")):
            for start in range(0, args.backlog, 1000):
                broker.send_many(queue, list(range(start, start + 1000)))
        owner = psycopg.connect(admin_url, autocommit=True)
        results: dict[tuple[str, str], list[float]] = {}

        def claim_complete(mode: str) -> None:
            start = time.perf_counter()
            claimed = acme.claim("acme-jobs", limit=10)
            middle = time.perf_counter()
            acme.complete(claimed)
            end = time.perf_counter()
            assert len(claimed) == 10, "the backlog ran out: raise --backlog"
            results.setdefault(("claim x10", mode), []).append(middle - start)
            results.setdefault(("complete x10", mode), []).append(end - middle)

        def send() -> None:
            acme.send("acme-jobs", {"n": 1})

        def settle(mode: str) -> None:
            if mode == "off":
                security.disable_tenants(admin.backend)
                return
            security.enable_tenants(admin.backend)
            owner.execute((SCHEMA_7 if mode == "schema 7" else SCHEMA_9).encode())

        modes = ["off", "schema 7", "schema 9"]
        for round_number in range(args.rounds):
            for mode in modes if round_number % 2 == 0 else modes[::-1]:
                settle(mode)
                for _ in range(args.ops):
                    claim_complete(mode)
                results.setdefault(("send x1", mode), []).extend(_timed(send, args.ops))
        # The median, and the 10th percentile: on a shared machine the low end shows the
        # statement's own cost best.
        for name in ("claim x10", "complete x10", "send x1"):
            for label, pick in (("median", statistics.median), ("p10", _p10)):
                ms = {mode: pick(results[(name, mode)]) * 1000 for mode in modes}
                print(
                    f"{name:14s} {label:6s} off {ms['off']:7.3f} ms"
                    f"   schema 7 {ms['schema 7']:7.3f} ms   schema 9 {ms['schema 9']:7.3f} ms"
                    f"   9/7 {ms['schema 9'] / ms['schema 7']:5.2f}"
                )
        owner.close()
        for broker in (acme, globex, admin):
            broker.close()


if __name__ == "__main__":
    main()
