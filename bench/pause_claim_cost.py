"""What the pause check costs a claim, measured against the claim without it in one run.

Schema 13 (docs/flow-control.md) makes the claim skip a paused subscription: one
uncorrelated ``NOT EXISTS`` probe of the subscription's primary key per claim statement.
Per backend (a SQLite file and a throwaway PostgreSQL server), two brokers on one database
drain one backlog: one with today's claim, one with the same statement minus the check,
switched in alternating rounds. Each operation claims 10 (timed) and completes them (not
timed). Prints medians and 10th percentiles, and the ratio with/without.

    .venv/bin/python bench/pause_claim_cost.py [--rounds 10] [--ops 200]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sqlbroker
from pgserver import PostgresServer

_PAUSE_CHECK = re.compile(
    r"\n\s*-- A paused subscription claims nothing[^\n]*(\n\s*--[^\n]*)*"
    r"\n\s*AND NOT EXISTS \(SELECT 1 FROM \S*sqlbroker_subscription s"
    r"\n\s*WHERE s\.name = \S+ AND s\.paused\)"
)


def _without_check(statement: str) -> str:
    old = _PAUSE_CHECK.sub("", statement)
    if old == statement or "paused" in old:
        raise RuntimeError(f"the pause check was not taken out of:\n{statement}")
    return old


def _p10(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 10]


def measure(url: str, rounds: int, ops: int) -> dict[str, list[float]]:
    backlog = rounds * 2 * ops * 10 + 1000
    brokers = {
        "without": sqlbroker.Broker(url, migrate=True),
        "with": sqlbroker.Broker(url, migrate=True),
    }
    plain = brokers["without"].backend
    plain._sql["message_claim"] = _without_check(plain._sql["message_claim"])  # type: ignore[attr-defined]
    feeder = brokers["with"]
    for start in range(0, backlog, 1000):
        feeder.send_many("jobs", list(range(start, start + 1000)))
    results: dict[str, list[float]] = {"without": [], "with": []}
    modes = ["without", "with"]
    for round_number in range(rounds):
        for mode in modes if round_number % 2 == 0 else modes[::-1]:
            broker = brokers[mode]
            for _ in range(ops):
                start = time.perf_counter()
                claimed = broker.claim("jobs", limit=10)
                results[mode].append(time.perf_counter() - start)
                assert len(claimed) == 10, "the backlog ran out"
                broker.complete(claimed)
    for broker in brokers.values():
        broker.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ops", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, PostgresServer() as pg:
        pg.create_database("bench")
        urls = {"sqlite": f"sqlite:///{directory}/bench.db", "postgresql": pg.url("bench")}
        for backend, url in urls.items():
            results = measure(url, args.rounds, args.ops)
            for label, pick in (("median", statistics.median), ("p10", _p10)):
                ms = {mode: pick(samples) * 1000 for mode, samples in results.items()}
                print(
                    f"{backend:10s} claim x10 {label:6s} without {ms['without']:7.3f} ms"
                    f"   with {ms['with']:7.3f} ms   with/without {ms['with'] / ms['without']:5.3f}"
                )


if __name__ == "__main__":
    main()
