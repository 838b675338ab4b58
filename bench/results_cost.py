"""The cost of stored results on the complete path, before and after, in one run.

Stored results (docs/results.md) must cost nothing when handlers return ``None``: such a
batch runs the very statement the tree ran before results existed (this script checks the
text against the commit it names, ``--base``), and a batch with values runs one statement
too (``message_complete_valued`` on SQLite, ``message_settle`` on PostgreSQL: the values
as one more array, the rows into sqlbroker_result, a NOTIFY per stored value on PostgreSQL).

Per target (SQLite and a throwaway PostgreSQL, each durable and fast) one queue with a
backlog is claimed in batches of ``--batch`` and each batch completed by one of:

- ``before``: ``message_settle_many`` of plain completes — the statement of the base commit;
- ``none``: the same batch as the write-back passes it when every handler returned None;
- ``values``: every handler returned a small JSON object (38 bytes);
- ``mixed``: one handler in ten returned one.

in alternating rounds; only the complete call is timed. Prints medians, 10th percentiles and
each variant's median over ``before``'s, and writes them to ``--out`` (Markdown).

    .venv/bin/python bench/results_cost.py [--rounds 6] [--ops 40] [--batch 1 --batch 50]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import sqlbroker  # noqa: E402
from pgserver import PostgresServer  # noqa: E402
from sqlbroker.core.settlements import Lease, Settlement  # noqa: E402
from sqlbroker.storage.backend import Backend  # noqa: E402
from sqlbroker.storage.sql import parse_blocks  # noqa: E402

VALUE = b'{"total":123,"status":"ok","lines":[1]}'
VARIANTS = ("before", "none", "values", "mixed")


def _values(variant: str, count: int) -> Sequence[bytes | None] | None:
    if variant == "before":
        return None
    if variant == "none":
        # What the write-back passes for an all-None batch: nothing (runtime/writeback.py).
        values: list[bytes | None] = [None] * count
        return values if any(value is not None for value in values) else None
    if variant == "values":
        return [VALUE] * count
    return [VALUE if index % 10 == 0 else None for index in range(count)]


def _check_unchanged(base: str) -> None:
    """The no-value statements are the base commit's, character for character."""
    for backend in ("postgres", "sqlite"):
        path = f"src/sqlbroker/storage/{backend}/queries.sql"
        old = parse_blocks(
            subprocess.run(
                ["git", "show", f"{base}:{path}"], cwd=ROOT, check=True, capture_output=True
            ).stdout.decode()
        )
        new = parse_blocks((ROOT / path).read_text())
        names = (
            ["message_complete", "message_complete_unarchived"]
            if backend == "postgres"
            else ["lease_valid_ids", "archive_insert_ids", "message_delete_ids"]
        )
        for name in names:
            if old[name] != new[name]:
                raise SystemExit(f"{backend} {name} differs from {base}'s")


def _measure(
    backend: Backend, queue: str, rounds: int, ops: int, batch: int
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_number in range(rounds):
        order = VARIANTS if round_number % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            for _ in range(ops):
                claimed = backend.message_claim_many(
                    subscription=queue, limit=batch, lease=60.0, worker="bench"
                )
                assert len(claimed) == batch, "the backlog ran out"
                leases = [Lease.of(delivery) for delivery in claimed]
                values = _values(variant, batch)
                settlements = [
                    Settlement.complete(lease, None if values is None else values[n])
                    for n, lease in enumerate(leases)
                ]
                start = time.perf_counter()
                done = backend.message_settle_many(settlements=settlements)
                samples[variant].append(time.perf_counter() - start)
                assert len(done) == batch
    return samples


def _fill(broker: sqlbroker.Broker, queue: str, count: int) -> None:
    for start in range(0, count, 1000):
        broker.send_many(queue, list(range(start, min(count, start + 1000))))


def _p10(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 10]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=40)
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--base", default="325ed76", help="the commit before stored results")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/results_cost.md")
    args = parser.parse_args()
    batches = args.batch or [1, 50]
    _check_unchanged(args.base)
    rows: list[str] = []
    for durable in (True, False):
        mode = "durable" if durable else "fast"
        with tempfile.TemporaryDirectory() as tmp, PostgresServer(durable=durable) as pg:
            targets = {
                "sqlite": (
                    f"sqlite:///{tmp}/bench.db",
                    {"synchronous": "full" if durable else "normal"},
                ),
                "postgresql": (pg.url(), {}),
            }
            for name, (url, options) in targets.items():
                with sqlbroker.Broker(url, migrate=True, **options) as broker:
                    for batch in batches:
                        queue = f"jobs{batch}"
                        _fill(broker, queue, args.rounds * len(VARIANTS) * args.ops * batch)
                        samples = _measure(broker.backend, queue, args.rounds, args.ops, batch)
                        base = statistics.median(samples["before"])
                        base_p10 = _p10(samples["before"])
                        for variant in VARIANTS:
                            median = statistics.median(samples[variant])
                            p10 = _p10(samples[variant])
                            line = (
                                f"| {name} {mode} | {batch} | {variant} | {median * 1000:.3f} |"
                                f" {p10 * 1000:.3f} | {median / base:.2f} | {p10 / base_p10:.2f} |"
                            )
                            rows.append(line)
                            print(line, flush=True)
    header = [
        "# Stored results: the complete path before and after",
        "",
        f"`bench/results_cost.py --rounds {args.rounds} --ops {args.ops}"
        + "".join(f" --batch {b}" for b in batches)
        + f"` · {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} · Python"
        f" {platform.python_version()} · base {args.base} (its no-value statements are the"
        " ones `before` and `none` run, checked)",
        "",
        "One complete call per sample, a batch of leases claimed just before (not timed).",
        "`durable`: SQLite synchronous=FULL, PostgreSQL fsync and synchronous_commit on",
        "(the defaults); `fast`: SQLite synchronous=NORMAL, PostgreSQL fsync off — the",
        "statement's own cost, without the flush that dominates a durable commit. `before`",
        "and `none` run the same statement: their ratio is the noise of the run. 2 cores",
        "shared with other work: the p10 ratio is the steadier one.",
        "",
        "| target | batch | variant | median ms | p10 ms | median ÷ before | p10 ÷ before |",
        "|---|---|---|---|---|---|---|",
    ]
    args.out.write_text("\n".join(header + rows) + "\n")


if __name__ == "__main__":
    main()
