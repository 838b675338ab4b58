"""Whether schema 15 slowed the claim of a subscription without flow limits: main's claim
statement against this tree's, in one run.

The only change on that path is the plain claim's primary-key probe of the subscription,
which now also tests the flow columns. Per backend (a SQLite file and a throwaway
PostgreSQL server), two brokers drain one backlog: one with main's ``message_claim`` block
(read from git, ``--baseline``), one with this tree's, switched in alternating rounds.
Each operation claims 10 (timed) and completes them (not timed).

    .venv/bin/python bench/flow_plain_claim_cost.py [--baseline b1cfcae] [--rounds 8] [--ops 150]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import sqlbroker  # noqa: E402
from pgserver import PostgresServer  # noqa: E402
from sqlbroker.storage.sql import parse_blocks  # noqa: E402

FILES = {
    "sqlite": "src/sqlbroker/storage/sqlite/queries.sql",
    "postgresql": "src/sqlbroker/storage/postgres/queries.sql",
}


def baseline_claim(commit: str, backend: str) -> str:
    text = subprocess.check_output(["git", "-C", str(ROOT), "show", f"{commit}:{FILES[backend]}"])
    return parse_blocks(text.decode())["message_claim"]


def measure(url: str, statement: str, rounds: int, ops: int) -> dict[str, list[float]]:
    brokers = {
        "baseline": sqlbroker.Broker(url, migrate=True),
        "this": sqlbroker.Broker(url, migrate=True),
    }
    brokers["baseline"].backend._sql["message_claim"] = statement.replace("{schema}", "")  # type: ignore[attr-defined]
    backlog = rounds * 2 * ops * 10 + 1000
    for start in range(0, backlog, 1000):
        brokers["this"].send_many("jobs", list(range(start, start + 1000)))
    results: dict[str, list[float]] = {"baseline": [], "this": []}
    for round_number in range(rounds):
        for mode in ("baseline", "this") if round_number % 2 == 0 else ("this", "baseline"):
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
    parser.add_argument("--baseline", default="b1cfcae")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--ops", type=int, default=150)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, PostgresServer() as pg:
        pg.create_database("bench")
        urls = {"sqlite": f"sqlite:///{directory}/bench.db", "postgresql": pg.url("bench")}
        for backend, url in urls.items():
            statement = baseline_claim(args.baseline, backend)
            results = measure(url, statement, args.rounds, args.ops)
            ms = {mode: statistics.median(samples) * 1000 for mode, samples in results.items()}
            ratio = ms["baseline"] / ms["this"]
            print(
                f"{backend:10s} claim x10 median  {args.baseline} {ms['baseline']:7.3f} ms"
                f"   this tree {ms['this']:7.3f} ms   speed ratio {ratio:5.3f}"
            )


if __name__ == "__main__":
    main()
