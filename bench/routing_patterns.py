"""Routing cost with many never-matching patterns (issue 29, item 6).

    .venv/bin/python bench/routing_patterns.py [SUBSCRIPTIONS PATTERNS PUBLISHES]

Creates SUBSCRIPTIONS subscriptions (default 1000) of PATTERNS patterns each (default 100;
half with a literal first segment, half starting with '#'), none matching the topic
published, plus one subscription that does match, then prints the mean time of a publish
on SQLite (a temporary file) and PostgreSQL (a throwaway server, tests/pgserver.py). The
broker's default limits refuse that many patterns, so this raises them.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sqlbroker
from pgserver import PostgresServer


def measure(url: str, subscriptions: int, patterns: int, publishes: int) -> float:
    broker = sqlbroker.Broker(url, migrate=True, max_patterns=subscriptions * patterns + 1)
    for s in range(subscriptions):
        broker.subscribe(
            f"sub{s}",
            [f"never{s}.x{p}.#" if p % 2 else f"#.never{s}.y{p}" for p in range(patterns)],
        )
    broker.subscribe("real", ["orders.*"])
    broker.publish("orders.created", {"n": -1})
    start = time.perf_counter()
    for n in range(publishes):
        broker.publish("orders.created", {"n": n})
    elapsed = (time.perf_counter() - start) / publishes
    broker.close()
    return elapsed


def main() -> None:
    subscriptions, patterns, publishes = (int(a) for a in (sys.argv[1:] or ["1000", "100", "10"]))
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/routing.db"
        seconds = measure(url, subscriptions, patterns, publishes)
        print(f"sqlite      {subscriptions} x {patterns}: {seconds * 1000:.1f} ms per publish")
    with PostgresServer() as server:
        server.create_database("routing")
        seconds = measure(server.url("routing"), subscriptions, patterns, publishes)
        print(f"postgresql  {subscriptions} x {patterns}: {seconds * 1000:.1f} ms per publish")


if __name__ == "__main__":
    main()
