"""AsyncBroker's single send against pgqueuer's async enqueue, with a baseline tree in the
same run (issue 24, item 5: the async face native on psycopg's AsyncConnection).

    .venv/bin/python bench/async_face.py --baseline b1cfcae [--messages 5000] [--repeats 5]
        [--out bench/results] [--name async_face]

Cases, round-robin on one durable PostgreSQL, each repetition on a fresh database:
``await AsyncBroker.send`` one after the other in one coroutine (``publish.single.async``)
and ``await AsyncBroker.send_many`` in batches of 500 (``publish.batch.async``), each in this
tree and in the baseline tree (a fresh interpreter per repetition with the tree first on
the path, as ``bench/compare_trees.py`` runs them), pgqueuer's ``await Queries.enqueue``
one after the other and the raw floor's single send. Writes ``<name>.json`` and
``<name>.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import compare_trees
import harness
import peers
import systems
from harness import DEFAULT, Case, PostgresTarget


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", required=True, help="a directory or a git commit")
    parser.add_argument("--messages", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-noise", type=float, default=100.0, metavar="PCT")
    parser.add_argument("--out", type=Path, default=harness.BENCH_DIR / "results")
    parser.add_argument("--name", default="async_face")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the server stops
    n = args.messages
    sizes = dataclasses.replace(
        DEFAULT, mode="async_face", repeats=args.repeats, publish_single=n, publish_batch=4 * n
    )
    started = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    versions = peers.ensure_venv(log)
    with (
        compare_trees.checkout(str(harness.REPO_DIR)) as (candidate, candidate_commit),
        compare_trees.checkout(args.baseline) as (baseline, baseline_commit),
    ):
        log("starting a durable PostgreSQL server …")
        server = harness.start_postgres()
        try:
            target = PostgresTarget(server)
            cases = [
                Case(f"sqlbroker@{tree}", target, name, compare_trees.in_tree(src, name))
                for name in ("publish.single.async", "publish.batch.async")
                for tree, src in (("candidate", candidate), ("baseline", baseline))
            ]
            cases += [
                Case(s, target, "publish.single", systems.load(s).WORKLOADS["publish.single"])
                for s in ("pgqueuer", "floor")
            ]
            machine = harness.machine_info()
            machine["peers"] = versions
            described = target.describe()
            outcome = harness.run_cases(cases, sizes=sizes, log=log, max_noise=args.max_noise)
        finally:
            server.stop()
    report = {
        "command": "bench/async_face.py " + " ".join(sys.argv[1:]),
        "candidate": candidate_commit,
        "baseline": baseline_commit,
        "duration_s": round(time.perf_counter() - started, 1),
        "load_avg_at_start": load_start,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "sizes": dataclasses.asdict(sizes),
        "machine": machine,
        "target": described,
        "results": [r.to_json() for r in outcome],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)
    return 1 if any(r.error for r in outcome) else 0


RATIOS = (
    ("candidate single send ÷ pgqueuer", "sqlbroker@candidate:publish.single.async"),
    ("baseline single send ÷ pgqueuer", "sqlbroker@baseline:publish.single.async"),
)


BATCH = "sqlbroker@{}:publish.batch.async"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    rates = {
        f"{r['system']}:{r['workload']}": r["metrics"]["rate"]["samples"]
        for r in report["results"]
        if not r["error"]
    }

    def ratio(ours: str, theirs: str) -> str:
        if ours not in rates or theirs not in rates:
            return "—"
        rounds = [a / b for a, b in zip(rates[ours], rates[theirs], strict=False)]
        median = statistics.median(rates[ours]) / statistics.median(rates[theirs])
        shown = ", ".join(f"{r:.2f}" for r in rounds)
        return f"**{median:.2f}×** | {shown} ({statistics.median(rounds):.2f}×)"

    pgqueuer = "pgqueuer:publish.single"
    lines = [
        "# AsyncBroker against pgqueuer, this tree and a baseline in one run",
        "",
        f"{m['date']} · candidate `{report['candidate'][:12]}` · baseline"
        f" `{report['baseline'][:12]}` · `{report['command'].strip()}` ·"
        f" {report['duration_s']:.0f} s · {m['cpu_cores']} cores ({m['cpu_model']}) · load"
        f" average {report['load_avg_at_start']} at the start, {report['load_avg_at_end']} at"
        f" the end · PostgreSQL {report['target'].get('server_version')}, durable · fsync"
        f" probe {m['fsync_probe_ms']} ms.",
        "",
        f"{report['sizes']['publish_single']:,} single sends and"
        f" {report['sizes']['publish_batch']:,} messages in batches of"
        f" {report['sizes']['batch_size']} per case, {report['sizes']['repeats']} interleaved"
        " repetitions, each on a fresh database. *Per repetition*: each round's own ratio"
        " (the contenders ran back to back in it) and their median.",
        "",
        "| ratio | medians | per repetition (median) |",
        "|---|---|---|",
        f"| candidate single send ÷ pgqueuer | {ratio(RATIOS[0][1], pgqueuer)} |",
        f"| baseline single send ÷ pgqueuer | {ratio(RATIOS[1][1], pgqueuer)} |",
        f"| candidate ÷ baseline, single send | {ratio(RATIOS[0][1], RATIOS[1][1])} |",
        "| candidate ÷ baseline, send_many |"
        f" {ratio(BATCH.format('candidate'), BATCH.format('baseline'))} |",
        f"| candidate single send ÷ raw floor | {ratio(RATIOS[0][1], 'floor:publish.single')} |",
        "",
        "| system | workload | msg/s median (min–max) |",
        "|---|---|---|",
    ]
    for result in report["results"]:
        if result["error"]:
            lines.append(
                f"| {result['system']} | `{result['workload']}` | FAILED: {result['error']} |"
            )
            continue
        rate = result["metrics"]["rate"]
        lines.append(
            f"| {result['system']} | `{result['workload']}` | **{rate['median']:,.0f}**"
            f" ({rate['min']:,.0f}–{rate['max']:,.0f}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
