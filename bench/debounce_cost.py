"""What a replacing or debounced publish costs, as a ratio to a plain send in the same run.

Per backend (a SQLite file and a throwaway PostgreSQL server), one queue per mode on one
database; each operation is one ``send`` (timed), the modes in turn within each round and
in reversed order every other round:

- ``plain``: no ordering key;
- ``keyed``: one of 100 ordering keys (a keyed publish: the key's lock on PostgreSQL);
- ``replace``: the same keys with ``replace=True``; after the first 100 every send
  replaces its key's pending copy (the queue holds 100 copies throughout);
- ``debounce``: the same with ``debounce=60, debounce_max=600``.

Prints medians and the ratios to ``plain`` and ``keyed`` and writes ``--out``.md/.json.

    .venv/bin/python bench/debounce_cost.py [--rounds 6] [--ops 100] [--out PATH]
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

KEYS = 100
MODES: dict[str, dict[str, Any]] = {
    "plain": {},
    "keyed": {"keyed": True},
    "replace": {"keyed": True, "replace": True},
    "debounce": {"keyed": True, "debounce": 60, "debounce_max": 600},
}


def measure(url: str, rounds: int, ops: int) -> dict[str, list[float]]:
    broker = sqlbroker.Broker(url, migrate=True)
    broker.migrate()
    for mode in MODES:
        broker.backend.subscription_ensure(name=f"cost-{mode}")
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    order = list(MODES)
    sent = 0
    for round_number in range(rounds):
        for mode in order if round_number % 2 == 0 else order[::-1]:
            options = dict(MODES[mode])
            keyed = options.pop("keyed", False)
            for n in range(ops):
                key = {"key": f"k{(sent + n) % KEYS}"} if keyed else {}
                start = time.perf_counter()
                broker.send(f"cost-{mode}", {"n": n}, **key, **options)
                results[mode].append(time.perf_counter() - start)
        sent += ops
    for mode in ("replace", "debounce"):
        waiting = len(broker.pending(f"cost-{mode}", limit=1000))
        assert waiting == KEYS, f"{mode}: {waiting} copies waiting, not {KEYS}"
    broker.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--out", default="bench/results/debounce_s16")
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
            keyed = statistics.median(results["keyed"])
            rows = {}
            for mode, samples in results.items():
                median = statistics.median(samples)
                rows[mode] = {
                    "median_ms": median * 1000,
                    "ratio_plain": median / plain,
                    "ratio_keyed": median / keyed,
                }
                print(
                    f"{backend:10s} {mode:9s} send median {median * 1000:7.3f} ms"
                    f"   / plain {median / plain:5.2f}   / keyed {median / keyed:5.2f}"
                )
            report["backends"][backend] = rows
    report.update(run.stamp())
    lines = [
        "# What a replacing or debounced publish costs (`bench/debounce_cost.py`)",
        "",
        f"{run.header(report)} · {args.rounds} rounds of"
        f" {args.ops} sends per mode, the modes interleaved. 100 ordering keys; in the"
        " replace and debounce modes every send after the first 100 replaces a pending copy.",
        "",
        "| backend | mode | median ms per send | ÷ plain | ÷ keyed |",
        "|---|---|---|---|---|",
    ]
    for backend, rows in report["backends"].items():
        for mode, row in rows.items():
            lines.append(
                f"| {backend} | `{mode}` | {row['median_ms']:.3f} | {row['ratio_plain']:.2f}× |"
                f" {row['ratio_keyed']:.2f}× |"
            )
    write(args.out, report, lines)


if __name__ == "__main__":
    main()
