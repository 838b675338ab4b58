"""Issue 24's speed targets, measured in one run, interleaved, on a durable PostgreSQL.

    .venv/bin/python bench/targets.py [--messages 20000] [--repeats 5] [--out bench/results]
        [--case publish.single …]

- single send: ``await AsyncBroker.send`` in a loop ≥ 1× pgqueuer's ``await
  Queries.enqueue`` in a loop;
- batch of 500: ``Broker.send_many`` ≥ 0.8× the raw floor (the faster of unnest and COPY)
  and ≥ 1× pgmq's ``send_batch`` (the faster of its client and its SQL function);
- worker drain: ``run_until_idle`` (concurrency 4, prefetch 10, async no-op handler, one
  worker process) ≥ 1.2× pgmq's 4-thread ``read(qty=10)`` / ``delete_batch`` loop.

Also measured, for the reader: the floor's single send and claim-10 drain, and
``AsyncBroker.send_many``. Every case is one of ``bench/run.py``'s workload functions
(``systems/``), each repetition on a fresh database, round-robin over all cases; the
ratios divide medians of the same run. Writes ``targets.json`` and ``targets.md``.
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

import harness
import peers
import systems
from harness import DEFAULT, Case, CaseResult, PostgresTarget
from systems import sqlbroker_system

CASES = (
    ("sqlbroker", "publish.single.async"),
    ("pgqueuer", "publish.single"),
    ("floor", "publish.single"),
    ("sqlbroker", "publish.batch"),
    ("sqlbroker", "publish.batch.async"),
    ("floor", "publish.batch"),
    ("pgmq", "publish.batch"),
    ("sqlbroker", "drain.runtime.prefetch10"),
    ("pgmq", "drain.claim10"),
    ("floor", "drain.claim10"),
)

TARGETS = (
    # (label, ours, theirs, bound)
    (
        "AsyncBroker single send ≥ pgqueuer's async enqueue",
        ("sqlbroker", "publish.single.async"),
        ("pgqueuer", "publish.single"),
        1.0,
    ),
    (
        "batch of 500 ≥ 0.8× the raw floor",
        ("sqlbroker", "publish.batch"),
        ("floor", "publish.batch"),
        0.8,
    ),
    (
        "batch of 500 ≥ pgmq's send_batch",
        ("sqlbroker", "publish.batch"),
        ("pgmq", "publish.batch"),
        1.0,
    ),
    (
        "worker drain (concurrency 4, prefetch 10) ≥ 1.2× pgmq's claim-10 loop",
        ("sqlbroker", "drain.runtime.prefetch10"),
        ("pgmq", "drain.claim10"),
        1.2,
    ),
)
INFORMATIVE = (
    ("AsyncBroker single send ÷ raw floor", "publish.single.async", ("floor", "publish.single")),
    ("AsyncBroker send_many ÷ raw floor", "publish.batch.async", ("floor", "publish.batch")),
    ("AsyncBroker send_many ÷ pgmq", "publish.batch.async", ("pgmq", "publish.batch")),
    (
        "worker drain ÷ floor's claim-10 loop",
        "drain.runtime.prefetch10",
        ("floor", "drain.claim10"),
    ),
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def workload(system: str, name: str) -> harness.Workload:
    if system == "sqlbroker":
        return sqlbroker_system.TARGET_WORKLOADS[name]
    return systems.load(system).WORKLOADS[name]  # type: ignore[no-any-return]


def medians(outcome: list[CaseResult]) -> dict[tuple[str, str], float]:
    return {(r.system, r.workload): r.summary()["rate"].median for r in outcome if r.samples}


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--render":
        # Render a report's JSON again (after a change to the Markdown).
        path = Path(sys.argv[2])
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
        return 0
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-noise", type=float, default=25.0, metavar="PCT")
    parser.add_argument("--out", type=Path, default=harness.BENCH_DIR / "results")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for other processes to use under 10 %% of the CPU",
    )
    parser.add_argument(
        "--case",
        action="append",
        metavar="PREFIX",
        help="run only the cases whose workload starts with PREFIX (repeatable; all by default;"
        " give another --out to keep the committed report)",
    )
    args = parser.parse_args(argv)
    chosen = [(s, w) for s, w in CASES if not args.case or w.startswith(tuple(args.case))]
    harness.wait_for_quiet(args.wait_quiet, log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n = args.messages
    sizes = dataclasses.replace(
        DEFAULT,
        mode="targets",
        repeats=args.repeats,
        publish_single=n,
        publish_batch=n,
        batch_size=500,
        drain=n,
        drain_threads=4,
        worker_concurrency=4,
    )
    started = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    versions = peers.ensure_venv(log)
    log("starting a durable PostgreSQL server …")
    server = harness.start_postgres()
    try:
        target = PostgresTarget(server)
        cases = [Case(s, target, w, workload(s, w)) for s, w in chosen]
        machine = harness.machine_info()
        machine["peers"] = versions
        described = target.describe()
        outcome = harness.run_cases(cases, sizes=sizes, log=log, max_noise=args.max_noise)
    finally:
        server.stop()
    took = time.perf_counter() - started
    report = build(outcome, sizes, machine, described, load_start, took, args.max_noise)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "targets.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / "targets.md").write_text(text)
    print(text)
    return 1 if any(r.error for r in outcome) else 0


def build(
    outcome: list[CaseResult],
    sizes: harness.Sizes,
    machine: dict[str, Any],
    target: dict[str, Any],
    load_start: list[float],
    duration: float,
    max_noise: float,
) -> dict[str, Any]:
    rates = medians(outcome)
    checks = []
    for label, ours, theirs, bound in TARGETS:
        if ours in rates and theirs in rates:
            ratio = rates[ours] / rates[theirs]
            checks.append(
                {
                    "target": label,
                    "sqlbroker": f"{ours[0]}:{ours[1]}",
                    "against": f"{theirs[0]}:{theirs[1]}",
                    "ratio": round(ratio, 3),
                    "bound": bound,
                    "met": ratio >= bound,
                }
            )
    extra = []
    for label, ours_name, theirs in INFORMATIVE:
        ours = ("sqlbroker", ours_name)
        if ours in rates and theirs in rates:
            extra.append({"what": label, "ratio": round(rates[ours] / rates[theirs], 3)})
    return {
        "command": "bench/targets.py " + " ".join(sys.argv[1:]),
        "duration_s": round(duration, 1),
        "load_avg_at_start": load_start,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "max_noise": max_noise,
        "sizes": dataclasses.asdict(sizes),
        "machine": machine,
        "target": target,
        "targets": checks,
        "informative": extra,
        "results": [r.to_json() for r in outcome],
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    n = report["sizes"]["publish_single"]
    lines = [
        "# Issue 24's targets: one run, interleaved, durable PostgreSQL",
        "",
        f"{m['date']} · commit `{(m['git_commit'] or '?')[:12]}`"
        f"{' (dirty)' if m.get('git_dirty') else ''} · `{report['command'].strip()}` ·"
        f" {report['duration_s']:.0f} s · {m['cpu_cores']} cores ({m['cpu_model']}) ·"
        f" load average {report['load_avg_at_start']} at the start,"
        f" {report['load_avg_at_end']} at the end · PostgreSQL"
        f" {report['target'].get('server_version')}, fsync/synchronous_commit on · fsync"
        f" probe {m['fsync_probe_ms']} ms.",
        "",
        f"{n:,} messages per case, medians of {report['sizes']['repeats']} interleaved"
        " repetitions (each on a fresh database); a repetition during which other processes"
        f" used over {report['max_noise']:g} % of the CPU was measured again (at most"
        " twice). When other processes keep the machine busy, single sends are bound by"
        " the commit's fsync (see the fsync probe) for every contender alike.",
        "",
        "*Ratio* divides the medians; *per repetition* lists each round's own ratio (the"
        " contenders ran back to back in it) and their median, less exposed to the machine's"
        " drift.",
        "",
        "| target | ratio | per repetition (median) | bound | met |",
        "|---|---|---|---|---|",
    ]
    samples = {
        f"{r['system']}:{r['workload']}": r["metrics"]["rate"]["samples"]
        for r in report["results"]
        if not r["error"]
    }
    for check in report["targets"]:
        rounds = [
            a / b
            for a, b in zip(samples[check["sqlbroker"]], samples[check["against"]], strict=False)
        ]
        shown = ", ".join(f"{r:.2f}" for r in rounds)
        lines.append(
            f"| {check['target']} | **{check['ratio']:.2f}×** | {shown}"
            f" ({statistics.median(rounds):.2f}×) | {check['bound']:g}× |"
            f" {'yes' if check['met'] else '**no**'} |"
        )
    lines += ["", "Also measured:", ""]
    lines += [f"- {e['what']}: {e['ratio']:.2f}×" for e in report["informative"]]
    lines += [
        "",
        "| system | workload | msg/s median (min–max) | details (median repetition) |",
        "|---|---|---|---|",
    ]
    for result in report["results"]:
        if result["error"]:
            failed = f"FAILED: {result['error']}"
            lines.append(f"| {result['system']} | `{result['workload']}` | {failed} | |")
            continue
        rate = result["metrics"]["rate"]
        details = _median_details(result)
        lines.append(
            f"| {result['system']} | `{result['workload']}` | **{rate['median']:,.0f}**"
            f" ({rate['min']:,.0f}–{rate['max']:,.0f}) | {details} |"
        )
    lines += [
        "",
        "`floor:publish.batch` is the faster of `INSERT … SELECT FROM unnest($1::bytea[])`"
        " and a binary `COPY` (each on a fresh table, both rates in the JSON);"
        " `pgmq:publish.batch` the faster of its Python client's `send_batch` and its SQL"
        " function called with a prepared statement. `other_cpu_pct` in the JSON is the CPU"
        " other processes used during each repetition.",
    ]
    return "\n".join(lines) + "\n"


SHOWN = (
    "method",
    "unnest_rate",
    "copy_rate",
    "client_rate",
    "sql_rate",
    "send_p50_ms",
    "startup_s",
    "idle_detection_and_shutdown_s",
    "claim_calls",
    "claim_mean_rows",
    "other_cpu_pct",
)


def _median_details(result: dict[str, Any]) -> str:
    rate = result["metrics"]["rate"]
    samples = rate["samples"]
    index = samples.index(min(samples, key=lambda v: abs(v - rate["median"])))
    details = result["details"][index]
    return ", ".join(f"{k}={details[k]}" for k in SHOWN if k in details)


if __name__ == "__main__":
    raise SystemExit(main())
