"""Whether a rate limit of R/s holds within ±5 % over a minute with 4 worker processes
(issue 26), on both backends.

Per backend (a SQLite file and a throwaway PostgreSQL server): one queue with
``rate_limit="R/s"`` (default 50/s, far below what 4 workers drain unthrottled) and a
backlog larger than a minute can take; 4 worker processes (``Broker.run``, ``--concurrency``
handlers each, a handler that returns at once) drain it for ``--seconds`` + 15 s. The
achieved rate is read afterwards from the archive: each completed copy's
``first_started_at`` is its claim on the database clock (the limit counts claims, not
completions), counted per 10 s window from the first claim and over the first
``--seconds``. GCRA lets a burst of ``R`` claims through at once after a quiet spell (the
bucket allows one second's worth), so the first window also shows that burst; the
steady-state rate leaves it out (windows 2 onwards).

    .venv/bin/python bench/rate_limit_hold.py [--rate 50] [--seconds 60] [--workers 4]
        [--out bench/results/rate_limit_s16]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from report import Run, write  # noqa: E402

import sqlbroker  # noqa: E402
from pgserver import PostgresServer  # noqa: E402

QUEUE = "rated"
WINDOW = 10.0
WORKER = """
import sys
import sqlbroker

broker = sqlbroker.Broker(sys.argv[1])

@broker.subscriber(queue=sys.argv[2])
def handle(msg: sqlbroker.Message) -> None:
    pass

broker.run(timeout=float(sys.argv[3]), concurrency=int(sys.argv[4]),
           install_signal_handlers=False, poll_interval=0.2)
"""


def claim_times(url: str) -> list[float]:
    """Every archived copy's claim time, Unix seconds on the database clock."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            rows = conn.execute(
                "SELECT first_started_at FROM sqlbroker_archive WHERE subscription = ?", (QUEUE,)
            ).fetchall()
    else:
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM first_started_at)::float8 FROM sqlbroker_archive"
                " WHERE subscription = %s",
                (QUEUE,),
            ).fetchall()
    return sorted(float(row[0]) for row in rows)


def measure(url: str, rate: int, seconds: float, workers: int, concurrency: int) -> dict[str, Any]:
    with sqlbroker.Broker(url, migrate=True) as broker:
        broker.migrate()
        backlog = int(rate * (seconds + 30) * 1.5)
        for start in range(0, backlog, 1000):
            broker.send_many(QUEUE, list(range(start, min(start + 1000, backlog))))
        broker.set_flow(QUEUE, rate_limit=f"{rate}/s")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, QUEUE, str(seconds + 15), str(concurrency)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(workers)
    ]
    errors = [process.communicate(timeout=seconds + 120)[1] for process in processes]
    for process, error in zip(processes, errors, strict=True):
        assert process.returncode == 0, error.decode()
    times = claim_times(url)
    first = times[0]
    windows = [
        sum(1 for t in times if first + i * WINDOW <= t < first + (i + 1) * WINDOW) / WINDOW
        for i in range(int(seconds // WINDOW))
    ]
    overall = sum(1 for t in times if t < first + seconds) / seconds
    steady = sum(windows[1:]) / len(windows[1:])
    return {
        "rate": rate,
        "claimed": len(times),
        "windows_per_s": windows,
        "overall_per_s": overall,
        "steady_per_s": steady,
        "overall_error": overall / rate - 1,
        "steady_error": steady / rate - 1,
        "worst_window_error": max(abs(w / rate - 1) for w in windows[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", default="bench/results/rate_limit_s16")
    args = parser.parse_args()
    run = Run()
    report: dict[str, Any] = {
        "started": run.started_at,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "backends": {},
    }
    with tempfile.TemporaryDirectory() as directory, PostgresServer() as pg:
        pg.create_database("bench")
        urls = {"sqlite": f"sqlite:///{directory}/bench.db", "postgresql": pg.url("bench")}
        for backend, url in urls.items():
            found = measure(url, args.rate, args.seconds, args.workers, args.concurrency)
            report["backends"][backend] = found
            print(
                f"{backend:10s} {args.rate}/s: overall {found['overall_per_s']:.2f}/s"
                f" ({found['overall_error']:+.1%}), steady {found['steady_per_s']:.2f}/s"
                f" ({found['steady_error']:+.1%}), windows"
                f" {[round(w, 1) for w in found['windows_per_s']]}",
                flush=True,
            )
    report.update(run.stamp())
    lines = [
        "# A rate limit held by 4 worker processes (`bench/rate_limit_hold.py`)",
        "",
        f"{run.header(report)} · rate_limit {args.rate}/s,"
        f" {args.workers} worker processes of {args.concurrency} handlers, {args.seconds:.0f} s"
        " from the first claim; claims counted by their `first_started_at` (database clock).",
        "",
        "| backend | overall /s | error | steady (windows 2+) /s | error | worst window |"
        " windows of 10 s (/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend, found in report["backends"].items():
        lines.append(
            f"| {backend} | {found['overall_per_s']:.2f} | {found['overall_error']:+.1%}"
            f" | {found['steady_per_s']:.2f} | {found['steady_error']:+.1%}"
            f" | {found['worst_window_error']:.1%}"
            f" | {', '.join(f'{w:.1f}' for w in found['windows_per_s'])} |"
        )
    write(args.out, report, lines)


if __name__ == "__main__":
    main()
