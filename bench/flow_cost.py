"""What each flow limit costs a drain, as a ratio to the plain drain in the same run.

Per backend (a SQLite file and a throwaway PostgreSQL server), one queue per mode on one
database, each with its own backlog; every operation claims 10 and completes them (both
timed: a drain), the modes in turn within each round and in reversed order every other
round. The limits are set far above the achieved rate, so they decide nothing and what is
measured is their bookkeeping:

- ``plain``: no limits (the claim as before schema 15);
- ``max_running``: ``max_running=1_000_000``;
- ``rate_limit``: ``rate_limit="1000000/s"``;
- ``fair``: ``fair=True`` (copies without a key: one group, ranked);
- ``key_concurrency``: 100 ordering keys, ``key_concurrency=1_000_000``;
- ``key_rate_limit``: 100 keys, ``key_concurrency`` as above and ``key_rate_limit="1000000/s"``;
- ``all``: 100 keys, every limit above and ``fair=True``.

The keyed modes' backlogs are keyed (a key limit only acts on keyed copies), so they
differ from the plain drain in their data too. Prints medians and the ratio to ``plain``
and writes ``--out``.md/.json.

    .venv/bin/python bench/flow_cost.py [--rounds 6] [--ops 80] [--out bench/results/flow_s15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from report import Run, write

import sqlbroker
from pgserver import PostgresServer

BIG = 1_000_000
KEYS = 100
MODES: dict[str, tuple[dict[str, Any], bool]] = {
    "plain": ({}, False),
    "max_running": ({"max_running": BIG}, False),
    "rate_limit": ({"rate_limit": f"{BIG}/s"}, False),
    "fair": ({"fair": True}, False),
    "key_concurrency": ({"key_concurrency": BIG}, True),
    "key_rate_limit": ({"key_concurrency": BIG, "key_rate_limit": f"{BIG}/s"}, True),
    "all": (
        {
            "max_running": BIG,
            "key_concurrency": BIG,
            "rate_limit": f"{BIG}/s",
            "key_rate_limit": f"{BIG}/s",
            "fair": True,
        },
        True,
    ),
}


def measure(url: str, rounds: int, ops: int) -> dict[str, list[float]]:
    backlog = rounds * ops * 10 + 100
    broker = sqlbroker.Broker(url, migrate=True)
    broker.migrate()  # the backend's own operations below do not migrate a fresh database
    for mode, (limits, keyed) in MODES.items():
        queue = f"flow-{mode.replace('_', '-')}"
        broker.backend.subscription_ensure(name=queue)
        if limits:
            broker.set_flow(queue, **limits)
        for start in range(0, backlog, 1000):
            broker.publish_many(
                [
                    {"topic": queue, "payload": n, **({"key": f"k{n % KEYS}"} if keyed else {})}
                    for n in range(start, min(start + 1000, backlog))
                ]
            )
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    order = list(MODES)
    for round_number in range(rounds):
        for mode in order if round_number % 2 == 0 else order[::-1]:
            queue = f"flow-{mode.replace('_', '-')}"
            for _ in range(ops):
                start = time.perf_counter()
                claimed = broker.claim(queue, limit=10)
                broker.complete(claimed)
                results[mode].append(time.perf_counter() - start)
                assert len(claimed) == 10, f"{mode}: claimed {len(claimed)}"
    broker.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=80)
    parser.add_argument("--out", default="bench/results/flow_s15")
    args = parser.parse_args()
    run = Run()
    report: dict[str, Any] = {
        "started": run.started_at,
        "rounds": args.rounds,
        "ops": args.ops,
        "backends": {},
    }
    with tempfile.TemporaryDirectory() as directory, PostgresServer() as pg:
        pg.create_database("bench")
        urls = {"sqlite": f"sqlite:///{directory}/bench.db", "postgresql": pg.url("bench")}
        for backend, url in urls.items():
            results = measure(url, args.rounds, args.ops)
            plain = statistics.median(results["plain"])
            rows = {}
            for mode, samples in results.items():
                median = statistics.median(samples)
                rows[mode] = {"median_ms": median * 1000, "ratio": median / plain}
                print(
                    f"{backend:10s} {mode:16s} claim+complete x10 median {median * 1000:7.3f} ms"
                    f"   / plain {median / plain:5.2f}"
                )
            report["backends"][backend] = rows
    report.update(run.stamp())
    lines = [
        "# What each flow limit costs a drain (`bench/flow_cost.py`)",
        "",
        f"{run.header(report)} · {args.rounds} rounds of"
        f" {args.ops} operations per mode (claim 10 + complete them, both timed), the modes"
        " interleaved. Limits far above the achieved rate; the keyed modes drain 100 keys.",
        "",
        "| backend | mode | median ms per 10 | ÷ plain |",
        "|---|---|---|---|",
    ]
    for backend, rows in report["backends"].items():
        for mode, row in rows.items():
            lines.append(f"| {backend} | `{mode}` | {row['median_ms']:.3f} | {row['ratio']:.2f}× |")
    write(args.out, report, lines)


if __name__ == "__main__":
    main()
