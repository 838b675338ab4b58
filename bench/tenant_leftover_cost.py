"""The cost of schema 11 on settling, measured against schema 10 in one run.

Schema 11 (issue 29) gives dead letters and archive rows the tenant of their subscription,
written in the settling statement itself (one primary-key probe of the subscription per
copy), and its policies compare the row's tenant instead of the subscription name. One
throwaway server, one database, two tenants with a backlog each, isolation on; the same
tenant login claims batches of 10 and completes them (archived) or dead-letters them, under
schema 10 (its statements and its dead-letter and archive policies, restored by hand) and
schema 11, switched in alternating rounds. Prints medians and 10th percentiles.

    .venv/bin/python bench/tenant_leftover_cost.py [--rounds 10] [--ops 100]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tenants_setup import two_tenants

import sqlbroker
from pgserver import PostgresServer

SCHEMA_10 = """
DROP POLICY sqlbroker_tenant_isolation ON sqlbroker_dead;
CREATE POLICY sqlbroker_tenant_isolation ON sqlbroker_dead
    USING (subscription IN (SELECT s.name FROM sqlbroker_subscription s));
DROP POLICY sqlbroker_tenant_isolation ON sqlbroker_archive;
CREATE POLICY sqlbroker_tenant_isolation ON sqlbroker_archive
    USING (subscription IN (SELECT s.name FROM sqlbroker_subscription s)
           OR (subscription IS NULL
               AND tenant IS NOT DISTINCT FROM (SELECT sqlbroker_session_tenant())));
"""

SCHEMA_11 = """
DROP POLICY sqlbroker_tenant_isolation ON sqlbroker_dead;
CREATE POLICY sqlbroker_tenant_isolation ON sqlbroker_dead
    USING (tenant IS NOT DISTINCT FROM (SELECT sqlbroker_session_tenant()));
DROP POLICY sqlbroker_tenant_isolation ON sqlbroker_archive;
CREATE POLICY sqlbroker_tenant_isolation ON sqlbroker_archive
    USING (tenant IS NOT DISTINCT FROM (SELECT sqlbroker_session_tenant()));
"""

# Schema 10's statements: schema 11's without the tenant column and its subquery.
_TENANT_VALUE = re.compile(
    r",\s*\(SELECT s\.tenant FROM sqlbroker_subscription s WHERE s\.name = \w+\.subscription\)"
)


def _schema_10(statement: str) -> str:
    old = _TENANT_VALUE.sub("", statement.replace(", tenant\n    )", "\n    )"))
    if old == statement or "s.tenant" in old or "at, tenant" in old:
        raise RuntimeError(f"schema 11's tenant was not taken out of:\n{statement}")
    return old


def _p10(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 10]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ops", type=int, default=100)
    args = parser.parse_args()
    backlog = args.rounds * 2 * args.ops * 20 + 1000
    with PostgresServer() as pg:
        admin_url, urls = two_tenants(pg)
        admin = sqlbroker.Broker(admin_url)
        acme_url = urls["acme"]
        brokers = {"schema 10": sqlbroker.Broker(acme_url), "schema 11": sqlbroker.Broker(acme_url)}
        old = brokers["schema 10"].backend
        old._complete_sql = _schema_10(old._complete_sql)  # type: ignore[attr-defined]
        old._sql["message_dead"] = _schema_10(old._sql["message_dead"])  # type: ignore[attr-defined]
        globex = sqlbroker.Broker(urls["globex"])
        for broker, queue in ((brokers["schema 11"], "acme-jobs"), (globex, "globex-jobs")):
            for start in range(0, backlog, 1000):
                broker.send_many(queue, list(range(start, start + 1000)))
        owner = psycopg.connect(admin_url, autocommit=True)
        results: dict[tuple[str, str], list[float]] = {}

        def settle(mode: str, dead: bool) -> None:
            broker = brokers[mode]
            claimed = broker.claim("acme-jobs", limit=10)
            assert len(claimed) == 10, "the backlog ran out"
            start = time.perf_counter()
            if dead:
                for delivery in claimed:  # one statement per copy, as a worker settles
                    broker.dead_letter(delivery, reason="bench")
            else:
                broker.complete(claimed)
            elapsed = time.perf_counter() - start
            name = "dead-letter x10" if dead else "complete x10"
            results.setdefault((name, mode), []).append(elapsed)

        modes = ["schema 10", "schema 11"]
        for round_number in range(args.rounds):
            for mode in modes if round_number % 2 == 0 else modes[::-1]:
                owner.execute((SCHEMA_10 if mode == "schema 10" else SCHEMA_11).encode())
                for _ in range(args.ops):
                    settle(mode, dead=False)
                    settle(mode, dead=True)
        # The schema 11 rows carry acme's tenant; the schema 10 rows got it from the
        # column default (the writer's tenant): both are acme's.
        tenants = owner.execute(
            "SELECT DISTINCT tenant FROM sqlbroker_archive UNION SELECT DISTINCT tenant FROM"
            " sqlbroker_dead WHERE tenant IS NOT NULL"
        ).fetchall()
        print(f"tenants of the rows written: {sorted(t for (t,) in tenants)}")
        for name in ("complete x10", "dead-letter x10"):
            for label, pick in (("median", statistics.median), ("p10", _p10)):
                ms = {mode: pick(results[(name, mode)]) * 1000 for mode in modes}
                print(
                    f"{name:16s} {label:6s} schema 10 {ms['schema 10']:7.3f} ms"
                    f"   schema 11 {ms['schema 11']:7.3f} ms"
                    f"   11/10 {ms['schema 11'] / ms['schema 10']:5.2f}"
                )
        owner.close()
        for broker in (*brokers.values(), globex, admin):
            broker.close()


if __name__ == "__main__":
    main()
