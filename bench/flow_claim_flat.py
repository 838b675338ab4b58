"""Whether a fair or key-limited claim stays flat as keys pile up (issue 26): main's flow
claim statement against this tree's, in one run, on both backends.

Per backend (a SQLite file and a throwaway PostgreSQL server), two brokers on one database:
``before`` runs main's ``message_claim_flow`` block (read from git, ``--baseline``), ``after``
this tree's; they take turns, in reversed order every other round.

1. **Claim latency with keys waiting.** One queue per (mode, keys): ``keys`` distinct
   ordering keys, two copies each (so ``2 * keys`` waiting), or a burst of 10,000 copies of
   one key plus one quiet key. Each operation claims 10 (timed), then completes them and
   publishes one new copy of each key it completed (not timed), so the backlog stays the
   same. Modes: ``fair`` (``fair=True``) and ``key_concurrency`` (``key_concurrency=2``).
   The result is each latency's ratio to the same statement's latency with 100 keys.
   ``WARMUP`` untimed operations per statement and queue come first.
2. **Drain cost.** As ``bench/flow_cost.py``: 100 keys, a backlog of ``rounds * ops * 10 +
   100`` copies per queue, claim 10 + complete them (both timed), for ``plain`` (no limits),
   ``fair`` and ``key_concurrency`` (``1_000_000``), each flow mode before and after, as a
   ratio to the plain drain of the same run.

    .venv/bin/python bench/flow_claim_flat.py [--baseline 212029e] [--rounds 4] [--ops 40]
        [--out bench/results/flow_claim_s16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from report import Run, write  # noqa: E402

import sqlbroker  # noqa: E402
from pgserver import PostgresServer  # noqa: E402
from sqlbroker.storage.sql import parse_blocks  # noqa: E402

FILES = {
    "sqlite": "src/sqlbroker/storage/sqlite/flow.sql",
    "postgresql": "src/sqlbroker/storage/postgres/flow.sql",
}
TREES = ("before", "after")
LATENCY_MODES: dict[str, dict[str, Any]] = {
    "fair": {"fair": True},
    "key_concurrency": {"key_concurrency": 2},
}
KEY_COUNTS = (100, 1_000, 10_000)
WARMUP = 8
BURST = 10_000
DRAIN_MODES: dict[str, dict[str, Any]] = {
    "plain": {},
    "fair": {"fair": True},
    "key_concurrency": {"key_concurrency": 1_000_000},
}


def baseline_claim(commit: str, backend: str) -> str:
    text = subprocess.check_output(["git", "-C", str(ROOT), "show", f"{commit}:{FILES[backend]}"])
    return parse_blocks(text.decode())["message_claim_flow"].replace("{schema}", "")


def open_pair(url: str, statement: str) -> dict[str, sqlbroker.Broker]:
    brokers = {tree: sqlbroker.Broker(url, migrate=True) for tree in TREES}
    brokers["after"].migrate()
    brokers["before"].backend._sql["message_claim_flow"] = statement  # type: ignore[attr-defined]
    return brokers


def publish_keys(broker: sqlbroker.Broker, queue: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):
        broker.publish_many(
            [
                {"topic": queue, "payload": n, "key": key}
                for n, key in enumerate(keys[start : start + 1000])
            ]
        )


def interleaved(rounds: int, ops: int, step: Callable[[str], float]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {tree: [] for tree in TREES}
    for tree in TREES:  # untimed: psycopg prepares a statement on its 6th run
        for _ in range(WARMUP):
            step(tree)
    for round_number in range(rounds):
        for tree in TREES if round_number % 2 == 0 else TREES[::-1]:
            samples[tree].extend(step(tree) for _ in range(ops))
    return samples


def server_ms(url: str, statement: str, queue: str) -> float:
    """The claim statement's median execution time on the server (EXPLAIN ANALYZE, rolled
    back): what the statement costs, without the client's and the machine's noise."""
    params = {
        "subscription": queue,
        "limit": 10,
        "now": None,
        "lease": 30,
        "worker": "bench",
        "max_attempts": None,
        "claim_commit": "on",
    }
    times = []
    with psycopg.connect(url) as conn:
        for _ in range(7):
            (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchone()
            conn.rollback()
            document = json.loads(plan) if isinstance(plan, str) else plan
            times.append(float(document[0]["Execution Time"]))
    return statistics.median(times)


def latency(
    url: str, statement: str, rounds: int, ops: int
) -> dict[str, dict[str, dict[str, float]]]:
    brokers = open_pair(url, statement)
    setup = brokers["after"]
    scenarios: dict[str, list[str]] = {
        **{f"{count} keys": [f"k{n}" for n in range(count)] * 2 for count in KEY_COUNTS},
        "burst of one key": ["noisy"] * BURST + ["quiet"],
    }
    results: dict[str, dict[str, dict[str, float]]] = {}
    for mode, limits in LATENCY_MODES.items():
        for scenario, keys in scenarios.items():
            queue = f"lat-{mode.replace('_', '-')}-{scenario.split()[0]}"
            setup.backend.subscription_ensure(name=queue)
            setup.set_flow(queue, **limits)
            publish_keys(setup, queue, keys)

            def step(tree: str, queue: str = queue) -> float:
                broker = brokers[tree]
                start = time.perf_counter()
                claimed = broker.claim(queue, limit=10)
                took = time.perf_counter() - start
                assert claimed, f"{queue}: claimed nothing"
                broker.complete(claimed)
                publish_keys(broker, queue, [str(d.key) for d in claimed])
                return took

            samples = interleaved(rounds, ops, step)
            results.setdefault(mode, {})[scenario] = {
                tree: statistics.median(found) * 1000 for tree, found in samples.items()
            }
            if not url.startswith("sqlite"):
                for tree in TREES:
                    statement = brokers[tree].backend._sql["message_claim_flow"]  # type: ignore[attr-defined]
                    results[mode][scenario][f"{tree} server"] = server_ms(url, statement, queue)
            print(
                f"  {mode:16s} {scenario:18s} claim x10 median  before"
                f" {results[mode][scenario]['before']:8.3f} ms  after"
                f" {results[mode][scenario]['after']:8.3f} ms",
                flush=True,
            )
    for broker in brokers.values():
        broker.close()
    return results


def drain(url: str, statement: str, rounds: int, ops: int) -> dict[str, float]:
    brokers = open_pair(url, statement)
    setup = brokers["after"]
    backlog = rounds * ops * 10 * 2 + 100
    for mode, limits in DRAIN_MODES.items():
        queue = f"drain-{mode.replace('_', '-')}"
        setup.backend.subscription_ensure(name=queue)
        if limits:
            setup.set_flow(queue, **limits)
        publish_keys(setup, queue, [f"k{n % 100}" for n in range(backlog)])

    samples: dict[str, list[float]] = {}

    def claim_complete(broker: sqlbroker.Broker, queue: str) -> float:
        start = time.perf_counter()
        claimed = broker.claim(queue, limit=10)
        broker.complete(claimed)
        assert len(claimed) == 10, f"{queue}: claimed {len(claimed)}"
        return time.perf_counter() - start

    for round_number in range(rounds):
        order = [
            (mode, tree)
            for mode in DRAIN_MODES
            for tree in TREES
            if mode != "plain" or tree == "after"
        ]
        for mode, tree in order if round_number % 2 == 0 else order[::-1]:
            queue = f"drain-{mode.replace('_', '-')}"
            name = "plain" if mode == "plain" else f"{mode} {tree}"
            samples.setdefault(name, []).extend(
                claim_complete(brokers[tree], queue) for _ in range(ops)
            )
    for broker in brokers.values():
        broker.close()
    return {name: statistics.median(found) * 1000 for name, found in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="212029e")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ops", type=int, default=40)
    parser.add_argument("--out", default="bench/results/flow_claim_s16")
    args = parser.parse_args()
    run = Run()
    report: dict[str, Any] = {
        "started": run.started_at,
        "baseline": args.baseline,
        "rounds": args.rounds,
        "ops": args.ops,
        "backends": {},
    }
    with tempfile.TemporaryDirectory() as directory, PostgresServer() as pg:
        pg.create_database("latency")
        pg.create_database("drain")
        for backend in FILES:
            statement = baseline_claim(args.baseline, backend)
            url: Callable[[str], str] = (
                (lambda name: f"sqlite:///{directory}/{name}.db") if backend == "sqlite" else pg.url
            )
            print(backend, flush=True)
            report["backends"][backend] = {
                "latency_ms": latency(url("latency"), statement, args.rounds, args.ops),
                "drain_ms": drain(url("drain"), statement, args.rounds, args.ops),
            }
    report.update(run.stamp())
    write(args.out, report, markdown(report, run))


def markdown(report: dict[str, Any], run: Run) -> list[str]:
    lines = [
        "# Flow claims with keys piling up (`bench/flow_claim_flat.py`)",
        "",
        f"{run.header(report)} · before = main's"
        f" `message_claim_flow` ({report['baseline']}), after = this tree's, on one database,"
        f" alternating · {report['rounds']} rounds of {report['ops']} operations each.",
        "",
        "## Claim latency (claim 10, median ms; ÷ 100 keys: the same statement with 100 keys)",
        "",
        "| backend | mode | keys waiting | before ms | after ms | before ÷ 100 keys"
        " | after ÷ 100 keys |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend, found in report["backends"].items():
        for mode, scenarios in found["latency_ms"].items():
            base = scenarios["100 keys"]
            for scenario, ms in scenarios.items():
                lines.append(
                    f"| {backend} | `{mode}` | {scenario} | {ms['before']:.3f} | {ms['after']:.3f}"
                    f" | {ms['before'] / base['before']:.2f}×"
                    f" | {ms['after'] / base['after']:.2f}× |"
                )
    lines += [
        "",
        "## PostgreSQL: the claim statement's execution on the server (EXPLAIN ANALYZE,"
        " median of 7, rolled back)",
        "",
        "| mode | keys waiting | before ms | after ms | before ÷ 100 keys | after ÷ 100 keys |",
        "|---|---|---|---|---|---|",
    ]
    for found in report["backends"].values():
        for mode, scenarios in found["latency_ms"].items():
            base = scenarios["100 keys"]
            for scenario, ms in scenarios.items():
                if "after server" not in ms:
                    continue
                before, after = ms["before server"], ms["after server"]
                lines.append(
                    f"| `{mode}` | {scenario} | {before:.3f} | {after:.3f}"
                    f" | {before / base['before server']:.2f}×"
                    f" | {after / base['after server']:.2f}× |"
                )
    lines += [
        "",
        "## Drain cost (claim 10 + complete, median ms; ÷ plain of the same run)",
        "",
        "| backend | mode | median ms | ÷ plain |",
        "|---|---|---|---|",
    ]
    for backend, found in report["backends"].items():
        plain = found["drain_ms"]["plain"]
        for name, ms in found["drain_ms"].items():
            lines.append(f"| {backend} | `{name}` | {ms:.3f} | {ms / plain:.2f}× |")
    return lines


if __name__ == "__main__":
    main()
