"""What a keyed send costs, as a ratio to a plain send, before and after a change.

One PostgreSQL server and one SQLite directory; per tree (``--tree NAME=SRC``, e.g. the
tree before a change and the one after) one database per backend, holding two queues
with a backlog of 10,000 copies each: ``plain`` (no keys) and ``keyed`` (100 ordering
keys, 100 copies each). Each round runs, per tree in turn (the order reversed every other
round), a child process on that tree's sources that times ``--ops`` sends to each queue,
alternating plain and keyed (keyed sends cycle through the 100 keys: every one starts
blocked behind its key's backlog). Prints medians and keyed ÷ plain per tree and backend,
and writes ``--out``.md/.json.

    .venv/bin/python bench/keyed_cost.py --tree before=/path/to/old/src --tree after=src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from report import Run, write

KEYS, PER_KEY = 100, 100


def child(url: str, ops: int) -> None:
    """Time ``ops`` plain and ``ops`` keyed sends on ``url``; print the samples as JSON."""
    import sqlbroker

    broker = sqlbroker.Broker(url, migrate=True)
    broker.migrate()
    if not broker.pending("plain", limit=1):
        for k in range(KEYS):
            broker.send_many("plain", [{"n": n} for n in range(PER_KEY)])
            broker.send_many("keyed", [{"n": n} for n in range(PER_KEY)], key=f"k{k}")
    samples: dict[str, list[float]] = {"plain": [], "keyed": []}
    for n in range(ops):
        for mode in ("plain", "keyed") if n % 2 == 0 else ("keyed", "plain"):
            key = {"key": f"k{n % KEYS}"} if mode == "keyed" else {}
            start = time.perf_counter()
            broker.send(mode, {"n": n}, **key)
            samples[mode].append(time.perf_counter() - start)
    broker.close()
    print(json.dumps(samples))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="NAME=SRC")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--out", default="bench/results/keyed_s16")
    parser.add_argument("--child", nargs=2, metavar=("URL", "OPS"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pgserver import PostgresServer

    trees = dict(item.split("=", 1) for item in args.tree)
    run = Run()
    samples: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as directory, PostgresServer() as pg:
        urls: dict[tuple[str, str], str] = {}
        for name in trees:
            pg.create_database(f"bench_{name}")
            urls[(name, "postgresql")] = pg.url(f"bench_{name}")
            urls[(name, "sqlite")] = f"sqlite:///{directory}/{name}.db"
        for round_number in range(args.rounds):
            order = list(trees) if round_number % 2 == 0 else list(trees)[::-1]
            for name in order:
                for backend in ("sqlite", "postgresql"):
                    env = {**os.environ, "PYTHONPATH": str(Path(trees[name]).resolve())}
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--tree",
                            "x=x",
                            "--child",
                            urls[(name, backend)],
                            str(args.ops),
                        ],
                        env=env,
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                    got = json.loads(out.strip().splitlines()[-1])
                    rows = samples.setdefault(backend, {}).setdefault(name, {})
                    for mode, values in got.items():
                        rows.setdefault(mode, []).extend(values)
    report: dict[str, Any] = {
        "started": run.started_at,
        **run.stamp(),
        "rounds": args.rounds,
        "ops": args.ops,
        "results": {},
    }
    lines = [
        "# What a keyed send costs (`bench/keyed_cost.py`)",
        "",
        f"{run.header(report)} · {args.rounds} rounds of"
        f" {args.ops} sends per mode and tree, the trees in turn. Queues with a backlog of"
        f" {KEYS * PER_KEY:,} copies ({KEYS} keys × {PER_KEY} in the keyed one).",
        "",
        "| backend | tree | plain ms (median) | keyed ms (median) | keyed ÷ plain |",
        "|---|---|---|---|---|",
    ]
    for backend, by_tree in samples.items():
        for name, modes in by_tree.items():
            plain, keyed = (statistics.median(modes[m]) for m in ("plain", "keyed"))
            report["results"].setdefault(backend, {})[name] = {
                "plain_ms": plain * 1000,
                "keyed_ms": keyed * 1000,
                "ratio": keyed / plain,
            }
            line = (
                f"| {backend} | {name} | {plain * 1000:.3f} | {keyed * 1000:.3f}"
                f" | {keyed / plain:.2f}× |"
            )
            lines.append(line)
            print(line)
    write(args.out, report, lines)


if __name__ == "__main__":
    main()
