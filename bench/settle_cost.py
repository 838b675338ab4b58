"""A mixed write-back flush: one ``message_settle_many`` against one call per kind.

The worker's write-back used to write each kind of outcome by its own database call
(completes, retries, dead letters, cancels: up to four round trips and four commits per
flush); it now writes a mixed batch by one call (PostgreSQL: one statement). Per target
(a throwaway durable PostgreSQL, and SQLite) a queue with a backlog is claimed in batches
of ``--batch`` and each batch settled like a flush with failures in it (80 % complete, a
tenth of those with a result, 10 % retried, 6 % dead-lettered, 4 % cancelled), either:

- ``per_kind``: one ``message_settle_many`` per kind, in the old write-back's order;
- ``one_call``: one ``message_settle_many`` for the whole batch;

in alternating rounds; only the settle calls are timed. Prints the medians and their ratio.

    .venv/bin/python bench/settle_cost.py [--rounds 6] [--ops 30] [--batch 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import sqlbroker  # noqa: E402
from pgserver import PostgresServer  # noqa: E402
from sqlbroker.core.settlements import SETTLE_KINDS, Lease, Settlement  # noqa: E402
from sqlbroker.storage.backend import Backend  # noqa: E402

VARIANTS = ("per_kind", "one_call")


def _settlements(claimed: list[sqlbroker.Delivery]) -> list[Settlement]:
    settlements = []
    for index, delivery in enumerate(claimed):
        lease, slot = Lease.of(delivery), index % 50
        if slot < 40:
            settlements.append(Settlement.complete(lease, b'{"ok":1}' if slot % 10 == 0 else None))
        elif slot < 45:
            settlements.append(Settlement.retry(lease, 3600.0))
        elif slot < 48:
            settlements.append(Settlement.dead(lease, "declined"))
        else:
            settlements.append(Settlement.cancel(lease))
    return settlements


def _measure(backend: Backend, rounds: int, ops: int, batch: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_number in range(rounds):
        order = VARIANTS if round_number % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            for _ in range(ops):
                claimed = backend.message_claim_many(
                    subscription="jobs", limit=batch, lease=600.0, worker="bench"
                )
                assert len(claimed) == batch, "the backlog ran out"
                settlements = _settlements(claimed)
                groups = (
                    [[s for s in settlements if s.kind == kind] for kind in SETTLE_KINDS]
                    if variant == "per_kind"
                    else [settlements]
                )
                start = time.perf_counter()
                done = sum(len(backend.message_settle_many(settlements=g)) for g in groups)
                samples[variant].append(time.perf_counter() - start)
                assert done == batch
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=30)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    total = args.rounds * len(VARIANTS) * args.ops * args.batch
    print("| target | batch | per kind ms | one call ms | per kind ÷ one call |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, PostgresServer(durable=True) as pg:
        for name, url in (("postgresql", pg.url()), ("sqlite", f"sqlite:///{tmp}/bench.db")):
            with sqlbroker.Broker(url, migrate=True) as broker:
                for start in range(0, total, 1000):
                    broker.send_many("jobs", list(range(start, min(total, start + 1000))))
                samples = _measure(broker.backend, args.rounds, args.ops, args.batch)
            per_kind = statistics.median(samples["per_kind"]) * 1000
            one_call = statistics.median(samples["one_call"]) * 1000
            print(
                f"| {name} durable | {args.batch} | {per_kind:.2f} | {one_call:.2f} |"
                f" {per_kind / one_call:.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
