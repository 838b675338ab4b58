"""Compare two sqlbroker source trees in one run: same server, same workloads, interleaved.

    .venv/bin/python bench/compare_trees.py --baseline 325ed76 [--candidate .]
        [--workload publish.single …] [--backend postgresql|sqlite|all]
        [--sizes quick|default] [--repeats 5] [--out bench/results/compare_trees]

A tree is a directory holding ``src/sqlbroker`` or a git commit (checked out with ``git
worktree add --detach`` into a temporary directory, removed at the end). Each repetition of
each workload runs in a fresh interpreter of this virtual environment with
``PYTHONPATH=<tree>/src`` (its worker processes inherit it), on a fresh database; the
benchmark code (``bench/``) is this tree's for both, so both run the same workload through
sqlbroker's public API. Each round runs every (workload, tree) pair once, the two trees in
swapped order every other round. The report gives, per workload, both medians and the
*speed ratio* candidate ÷ baseline (for latency baseline ÷ candidate, so that below 1 is
slower either way); issue 24's bound is ≥ 0.95 for every workload of ``make bench``.
The default workloads are sqlbroker's workloads of ``make bench`` (``--quick``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
from harness import (
    DEFAULT,
    QUICK,
    BenchError,
    Case,
    CaseResult,
    Database,
    PostgresTarget,
    Sample,
    Sizes,
    SqliteTarget,
    Target,
)
from workloads import WORKLOADS, enabled

BOUND = 0.95
EXTRA = ("publish.single.async", "publish.batch.async", "drain.runtime.prefetch10")
"""``bench/targets.py``'s sqlbroker workloads, also accepted here."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- one repetition in the tree's interpreter --------------------------------------------


def run_one(request: dict[str, Any]) -> None:
    """The child: run one workload once and print its sample (with where sqlbroker came
    from) as one JSON line."""
    from systems import sqlbroker_system

    import sqlbroker

    database = Database(**request["database"])
    sizes = Sizes(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in request["sizes"].items()}
    )
    workloads = {**sqlbroker_system.WORKLOADS, **sqlbroker_system.TARGET_WORKLOADS}
    sample = workloads[request["workload"]](database, sizes)
    answer = {"metrics": sample.metrics, "details": sample.details}
    answer["details"]["sqlbroker_from"] = str(Path(sqlbroker.__file__).resolve().parent)
    print(json.dumps(answer), flush=True)


def in_tree(src: Path, workload: str) -> harness.Workload:
    """A workload function that runs ``workload`` with ``src`` first on the path."""

    def run(database: Database, sizes: Sizes) -> Sample:
        request = {
            "workload": workload,
            "database": dataclasses.asdict(database),
            "sizes": dataclasses.asdict(sizes),
        }
        env = {**os.environ, "PYTHONPATH": str(src)}
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--run-one", json.dumps(request)],
            env=env,
            cwd=harness.REPO_DIR,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0 or not done.stdout.strip():
            raise BenchError(f"{workload} in {src} failed: {done.stderr[-2000:]}")
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        if Path(answer["details"]["sqlbroker_from"]) != (src / "sqlbroker").resolve():
            raise BenchError(f"imported sqlbroker from {answer['details']['sqlbroker_from']}")
        return Sample(answer["metrics"], answer["details"])

    return run


# --- trees -------------------------------------------------------------------------------


@contextlib.contextmanager
def checkout(spec: str) -> Iterator[tuple[Path, str]]:
    """``(src directory, git commit)`` of a tree given as a directory or a commit."""
    path = Path(spec)
    if (path / "src" / "sqlbroker").is_dir():
        commit = _git(path, "rev-parse", "HEAD")
        dirty = _git(path, "status", "--porcelain", "--untracked-files=no", "--", "src")
        yield (path / "src").resolve(), commit + (" + uncommitted changes" if dirty else "")
        return
    commit = _git(harness.REPO_DIR, "rev-parse", "--verify", f"{spec}^{{commit}}")
    directory = Path(tempfile.mkdtemp(prefix="sqlbroker-tree-"))
    subprocess.run(
        ["git", "worktree", "add", "--quiet", "--detach", str(directory), commit],
        cwd=harness.REPO_DIR,
        check=True,
    )
    try:
        yield directory / "src", commit
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(directory)],
            cwd=harness.REPO_DIR,
            check=False,
        )
        shutil.rmtree(directory, ignore_errors=True)


def _git(where: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=where, capture_output=True, text=True, check=True
    ).stdout.strip()


# --- the run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--run-one":
        run_one(json.loads(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", required=True, help="a directory or a git commit")
    parser.add_argument("--candidate", default=str(harness.REPO_DIR), help="default: this tree")
    parser.add_argument("--workload", action="append", choices=sorted([*WORKLOADS, *EXTRA]))
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "all"], default="all")
    parser.add_argument("--sizes", choices=["quick", "default"], default="quick")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-noise", type=float, default=25.0, metavar="PCT")
    parser.add_argument("--out", type=Path, default=harness.BENCH_DIR / "results")
    parser.add_argument("--name", default="compare_trees", help="output file name stem")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for other processes to use under 10 %% of the CPU",
    )
    args = parser.parse_args(argv)
    harness.wait_for_quiet(args.wait_quiet, log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = dataclasses.replace(QUICK if args.sizes == "quick" else DEFAULT, repeats=1)
    from systems import sqlbroker_system

    names = args.workload or [
        w
        for w in sqlbroker_system.WORKLOADS
        if w in WORKLOADS and enabled(w, QUICK) and not w.startswith("claim.backlog.keyed")
    ]
    started = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    server: Any = None
    with (
        checkout(args.baseline) as (old_src, old_commit),
        checkout(args.candidate) as (
            new_src,
            new_commit,
        ),
    ):
        trees = {"baseline": old_src, "candidate": new_src}
        try:
            targets: list[Target] = []
            if args.backend in ("sqlite", "all"):
                targets.append(SqliteTarget("full"))
            if args.backend in ("postgresql", "all"):
                log("starting a durable PostgreSQL server …")
                server = harness.start_postgres()
                targets.append(PostgresTarget(server))
            pairs = [
                Case(tree, target, name, in_tree(src, name))
                for target in targets
                for name in names
                if sqlbroker_system.runs_on(name, target.name)
                for tree, src in trees.items()
            ]
            machine = harness.machine_info()
            results: dict[tuple[str, str, str], CaseResult] = {}
            for repeat in range(args.repeats):
                log(f"round {repeat + 1}/{args.repeats}")
                # Swap each pair's order every other round.
                order = pairs if repeat % 2 == 0 else _swapped(pairs)
                for result in harness.run_cases(
                    order, sizes=sizes, log=log, max_noise=args.max_noise
                ):
                    key = (result.system, result.target, result.workload)
                    merged = results.setdefault(
                        key, CaseResult(result.system, result.target, result.workload)
                    )
                    merged.samples += result.samples
                    merged.error = merged.error or result.error
        finally:
            if server is not None:
                server.stop()
    report = build(
        results,
        machine=machine,
        trees={"baseline": f"{args.baseline} ({old_commit})", "candidate": new_commit},
        sizes=dataclasses.replace(sizes, repeats=args.repeats),
        load_start=load_start,
        duration=time.perf_counter() - started,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)
    slower = [r for r in report["ratios"] if r["paired_ratio"] < BOUND]
    return 1 if slower or any(r.error for r in results.values()) else 0


def _swapped(pairs: list[Case]) -> list[Case]:
    out = list(pairs)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def build(
    results: dict[tuple[str, str, str], CaseResult],
    *,
    machine: dict[str, Any],
    trees: dict[str, str],
    sizes: Sizes,
    load_start: list[float],
    duration: float,
) -> dict[str, Any]:
    ratios = []
    for (tree, target, workload), old in results.items():
        new = results.get(("candidate", target, workload))
        if tree != "baseline" or new is None or not old.samples or not new.samples:
            continue
        info = WORKLOADS.get(workload)
        higher = info.higher_is_better if info else True
        metric = (info.metrics[-1] if info else "rate") if not higher else "rate"
        old_m = statistics.median(s.metrics[metric] for s in old.samples)
        new_m = statistics.median(s.metrics[metric] for s in new.samples)
        ratio = new_m / old_m if higher else old_m / new_m
        # The two trees ran one after the other in each round: the median of the rounds'
        # own ratios is less exposed to the machine's drift than the ratio of medians.
        pairs = zip(old.samples, new.samples, strict=False)
        paired = [n.metrics[metric] / o.metrics[metric] for o, n in pairs]
        if not higher:
            paired = [1 / p for p in paired]
        ratios.append(
            {
                "target": target,
                "workload": workload,
                "metric": metric,
                "baseline": round(old_m, 3),
                "candidate": round(new_m, 3),
                "ratio": round(ratio, 3),
                "paired_ratio": round(statistics.median(paired), 3),
                "samples": {
                    "baseline": [round(s.metrics[metric], 3) for s in old.samples],
                    "candidate": [round(s.metrics[metric], 3) for s in new.samples],
                },
                "other_cpu_pct": [
                    s.details.get("other_cpu_pct") for s in old.samples + new.samples
                ],
            }
        )
    return {
        "trees": trees,
        "duration_s": round(duration, 1),
        "load_avg_at_start": load_start,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "sizes": dataclasses.asdict(sizes),
        "machine": machine,
        "bound": BOUND,
        "ratios": ratios,
        "errors": {f"{k[0]}:{k[1]}:{k[2]}": r.error for k, r in results.items() if r.error},
        "results": [r.to_json() for r in results.values()],
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Same-run tree comparison (`bench/compare_trees.py`)",
        "",
        f"baseline: {report['trees']['baseline']} · candidate: {report['trees']['candidate']}",
        "",
        f"{m['date']} · {report['duration_s']:.0f} s · {m['cpu_cores']} cores · load"
        f" average {report['load_avg_at_start']} at the start, {report['load_avg_at_end']}"
        f" at the end · {report['sizes']['mode']} sizes, medians of"
        f" {report['sizes']['repeats']} rounds, the two trees interleaved (order swapped"
        " every other round), each repetition on a fresh database.",
        "",
        "Speed ratio = candidate ÷ baseline for throughput, baseline ÷ candidate for latency"
        f" (below 1: the candidate is slower); bound ≥ {report['bound']}. *Paired* is the"
        " median of each round's own ratio (the two trees ran back to back), less exposed"
        " to the machine's drift than the ratio of the medians; *others* the median CPU"
        " share other processes used meanwhile.",
        "",
        "| target | workload | metric | baseline | candidate | ratio of medians | paired |"
        " others |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["ratios"]:
        flag = "" if r["paired_ratio"] >= report["bound"] else " **below**"
        others = statistics.median(v for v in r["other_cpu_pct"] if v is not None)
        lines.append(
            f"| {r['target']} | `{r['workload']}` | {r['metric']} | {r['baseline']:,.1f} |"
            f" {r['candidate']:,.1f} | {r['ratio']:.2f}× | {r['paired_ratio']:.2f}×{flag} |"
            f" {others:.0f} % |"
        )
    for case, error in report["errors"].items():
        lines.append(f"\nFAILED {case}: {error}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
