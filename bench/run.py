"""Run the sqlbroker benchmark and write ``bench/results/latest.{json,md}``.

    .venv/bin/python bench/run.py [--quick] [--backend sqlite|postgresql|all] [--out DIR]

Starts its own durable throwaway PostgreSQL (``tests/pgserver.py``) and uses temporary
SQLite files; see ``bench/README.md`` for what each workload measures.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import harness
import peers
import results
import systems
from harness import DEFAULT, QUICK, Case, PostgresTarget, SqliteTarget, Target
from workloads import WORKLOADS, enabled


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="sqlbroker benchmark")
    parser.add_argument("--quick", action="store_true", help="small sizes, under 2 minutes")
    parser.add_argument(
        "--backend", choices=["sqlite", "postgresql", "all"], default="all", help="targets"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=harness.BENCH_DIR / "results",
        help="results directory (default bench/results)",
    )
    parser.add_argument(
        "--system",
        action="append",
        choices=sorted(systems.SYSTEMS),
        help="only these systems (repeatable; default all)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        choices=sorted(WORKLOADS),
        help="only these workloads, even those the sizes leave out (repeatable; default: all"
        " the sizes include)",
    )
    parser.add_argument("--repeats", type=int, help="override the number of repetitions (≥ 1)")
    parser.add_argument(
        "--soak-seconds", type=float, help="override the soak's length (0: no soak)"
    )
    parser.add_argument(
        "--max-noise",
        type=float,
        default=25.0,
        metavar="PCT",
        help="measure a repetition again when other processes used more than PCT %% of the"
        " CPU meanwhile (default 25)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for other processes to use under 10 %% of the CPU",
    )
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like an error, so that the PostgreSQL server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = QUICK if args.quick else DEFAULT
    if args.repeats is not None:
        if args.repeats < 1:
            raise SystemExit("--repeats must be at least 1")
        sizes = replace(sizes, repeats=args.repeats)
    if args.soak_seconds is not None:
        sizes = replace(sizes, soak_seconds=args.soak_seconds)
    harness.wait_for_quiet(args.wait_quiet, log)
    started = time.perf_counter()
    server: Any = None
    targets: list[Target] = []
    try:
        if args.backend in ("sqlite", "all"):
            targets += [SqliteTarget(mode) for mode in sizes.sqlite_modes]
        if args.backend in ("postgresql", "all"):
            log("starting a durable PostgreSQL server …")
            server = harness.start_postgres()
            targets += [PostgresTarget(server, mode) for mode in sizes.pg_commit_modes]
        chosen = args.system or list(systems.SYSTEMS)
        peer_versions: dict[str, str] = {}
        if any(name in systems.PEERS for name in chosen):
            try:
                peer_versions = peers.ensure_venv(log)
            except (OSError, subprocess.CalledProcessError) as error:
                # No package index (offline): measure what can be measured, and say so.
                log(f"cannot install the peers ({error}): running without them")
                peer_versions = {"not installed": str(error)}
                chosen = [name for name in chosen if name not in systems.PEERS]
        cases = [
            Case(name, target, workload, run, WORKLOADS[workload].repeats)
            for target in targets
            for name in chosen
            if target.backend in (module := systems.load(name)).BACKENDS
            for workload, run in module.WORKLOADS.items()
            if (workload in args.workload if args.workload else enabled(workload, sizes))
            and getattr(module, "runs_on", lambda *_: True)(workload, target.name)
        ]
        log(f"{len(cases)} cases × {sizes.repeats} repeats ({sizes.mode} sizes)")
        machine = harness.machine_info()
        machine["peers"] = peer_versions
        described = {target.name: target.describe() for target in targets}
        outcome = harness.run_cases(cases, sizes=sizes, log=log, max_noise=args.max_noise)
    finally:
        if server is not None:
            server.stop()
    command = "bench/run.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    report = results.build_report(
        results=outcome,
        sizes=sizes,
        machine=machine,
        targets=described,
        duration=time.perf_counter() - started,
        command=command.strip(),
        max_noise=args.max_noise,
    )
    for path in results.write(report, args.out):
        log(f"wrote {path}")
    print(results.render_markdown(report))
    return 1 if any(r.error for r in outcome) else 0


if __name__ == "__main__":
    raise SystemExit(main())
