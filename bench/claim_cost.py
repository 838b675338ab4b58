"""Client CPU of the worker's claim and settle calls, per call and per message, in the
worker's own shape (``async_ops`` on the loop's pool, claims of 14, settles of 140).

    PYTHONPATH=src .venv/bin/python bench/claim_cost.py [--messages 14000] [--repeats 3]

CPU time (``time.process_time``) does not count the waits for the server: what it measures
is the Python and libpq work of the calls, whatever the load of the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import resource

import harness
from harness import PostgresTarget
from systems import sqlbroker_system

from sqlbroker import Broker
from sqlbroker.core.settlements import Settlement

USER_ONLY = False


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime if USER_ONLY else usage.ru_utime + usage.ru_stime


async def _drain(broker: Broker, count: int, claim: int, settle: int) -> tuple[float, float]:
    ops = broker._backend.async_ops
    claim_cpu = settle_cpu = 0.0
    pending: list[Settlement] = []
    done = 0
    while done < count:
        started = _cpu()
        found = await ops.message_claim_many(
            subscription=harness.QUEUE, limit=claim, lease=60.0, worker="w", max_attempts=None
        )
        claim_cpu += _cpu() - started
        assert found, done
        done += len(found)
        pending += [Settlement.complete(d) for d in found]
        if len(pending) >= settle or done >= count:
            started = _cpu()
            await ops.message_settle_many(settlements=pending)
            settle_cpu += _cpu() - started
            pending = []
    return claim_cpu, settle_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=14000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--claim", type=int, default=14)
    parser.add_argument("--settle", type=int, default=140)
    parser.add_argument("--user", action="store_true", help="user CPU only")
    args = parser.parse_args()
    global USER_ONLY
    USER_ONLY = args.user
    server = harness.start_postgres()
    try:
        target = PostgresTarget(server)
        for _ in range(args.repeats):
            with target.fresh() as database:
                sqlbroker_system.prepublish(database, args.messages)
                with sqlbroker_system.open_broker(database) as broker:
                    claim, settle = asyncio.run(
                        _drain(broker, args.messages, args.claim, args.settle)
                    )
            n = args.messages
            print(
                f"claim {claim / (n / args.claim) * 1e6:7.1f} us/call"
                f" {claim / n * 1e6:6.2f} us/msg;"
                f" settle {settle / (n / args.settle) * 1e6:7.1f} us/call"
                f" {settle / n * 1e6:6.2f} us/msg",
                flush=True,
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
