"""Where the ``latency`` workload's time goes, stage by stage, in two trees in one run.

    .venv/bin/python bench/latency_stages.py --baseline DIR [--candidate DIR]
        [--rounds 4] [--messages 500] [--rate 100] [--settle 1.0]

A tree is a directory holding ``src/sqlbroker`` (``git worktree add --detach /tmp/old
325ed76`` makes one of a commit). Each round runs, for each tree (the order swapped every
other round), what the ``latency`` workload runs (bench/systems/sqlbroker_system.py): a
worker process (concurrency 4) on an idle queue, and a publisher that sends one message
every 1/rate s with ``Broker.send``, both with ``PYTHONPATH=<tree>/src``, on a fresh
database of one durable throwaway server. Every message's path is stamped with
``time.perf_counter_ns`` (CLOCK_MONOTONIC: one clock for both processes):

- ``send``: the publish call until it returns (its commit, NOTIFY included);
- ``notify``: the publish call until the worker's LISTEN session hands over the wake-up
  (``Worker._hint``);
- ``wake-up → claim``: until the claim operation starts;
- ``claim``: the claim operation (its connection checkout, round trip and decoding);
- ``claim → handler``: until the handler starts;
- ``after return``: from the publish call's return to the handler's start (the worker's
  share; the stages before overlap the send);
- ``total``: the workload's metric, the publish call to the handler's start.

The stamps come from wrapping a few of the worker's internals at run time (no tree is
changed): ``Worker._hint``, and the claim (the async executor's ``_execute`` on the
storage seam, ``message_claim_many_async`` on the trees before it). On a machine shared
with other work run it under ``chrt -f 20`` (its processes and the server's then run
before others'); even so the commits' fsyncs share the disk: compare many messages, and
read the p50 before the p99.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

QUEUE = "bench"
STAGES = ("send", "notify", "wake-up → claim", "claim", "claim → handler", "after return", "total")
ns = time.perf_counter_ns


def consume(url: str, count: int, out: str) -> None:
    """The worker process: handle ``count`` messages, then write the stamps to ``out``."""
    from sqlbroker import Broker, Message
    from sqlbroker.runtime import worker

    broker = Broker(url)
    stamps: list[tuple[str, int, int]] = []
    hint = worker.Worker._hint

    def stamped_hint(self: Any, subscription: str | None) -> None:
        stamps.append(("hint", ns(), 0))
        hint(self, subscription)

    worker.Worker._hint = stamped_hint  # type: ignore[method-assign]
    backend: Any = broker.backend
    if hasattr(backend, "async_ops"):  # the storage seam: every operation runs here
        execute = backend.async_ops._execute

        async def stamped_execute(plan: Any, access: Any) -> Any:
            started = ns()
            try:
                return await execute(plan, access)
            finally:
                if plan.__name__ == "message_claim_many":
                    stamps.append(("claim", started, ns()))

        backend.async_ops._execute = stamped_execute
    else:
        claim = backend.message_claim_many_async

        async def stamped_claim(**kwargs: Any) -> Any:
            started = ns()
            try:
                return await claim(**kwargs)
            finally:
                stamps.append(("claim", started, ns()))

        backend.message_claim_many_async = stamped_claim
    handled = [0]

    @broker.subscriber(queue=QUEUE, concurrency=4)
    async def measure(message: Message) -> None:
        now = ns()
        if message.payload.get("warmup"):
            print("ready", flush=True)
            return
        stamps.append(("start", now, message.payload["seq"]))
        handled[0] += 1
        if handled[0] >= count:
            broker.stop()

    broker.run(timeout=600, install_signal_handlers=False)
    broker.close()
    Path(out).write_text(json.dumps(stamps))


def publish(url: str, count: int, rate: float, settle: float, out: str) -> None:
    """The publisher: start the worker, send ``count`` messages at ``rate``, and write
    both processes' stamps to ``out``."""
    from sqlbroker import Broker

    broker = Broker(url, migrate=True)
    broker.send(QUEUE, {"warmup": True})
    worker_out = out + ".worker"
    command = [sys.executable, __file__, "consume", url, str(count), worker_out]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as worker:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise SystemExit("the worker did not start")
        time.sleep(settle)
        sends = []
        started = time.perf_counter()
        for seq in range(count):
            delay = started + seq / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            called = ns()
            broker.send(QUEUE, {"seq": seq, "t": time.time(), "kind": "bench", "body": "x" * 150})
            sends.append((seq, called, ns()))
        worker.wait(timeout=120)
    broker.close()
    stamps = json.loads(Path(worker_out).read_text())
    Path(out).write_text(json.dumps({"sends": sends, "stamps": stamps}))


def stages(run: dict[str, Any]) -> dict[str, list[float]]:
    """Each message's stage durations (ms) from one run's stamps."""
    import bisect

    found: dict[str, list[float]] = defaultdict(list)
    stamps = run["stamps"]
    starts = {seq: at for name, at, seq in stamps if name == "start"}
    hints = sorted(at for name, at, _ in stamps if name == "hint")
    claims = sorted((at, end) for name, at, end in stamps if name == "claim")
    claim_starts = [at for at, _ in claims]
    for seq, called, returned in run["sends"]:
        start = starts[seq]
        # The claim that took this message: the last one to start before its handler.
        claim_start, claim_end = claims[bisect.bisect_right(claim_starts, start) - 1]
        index = bisect.bisect_left(hints, called)
        hint = hints[index] if index < len(hints) else None
        found["send"].append((returned - called) / 1e6)
        if hint is not None and hint <= claim_start:
            found["notify"].append((hint - called) / 1e6)
            found["wake-up → claim"].append((claim_start - hint) / 1e6)
        found["claim"].append((claim_end - claim_start) / 1e6)
        found["claim → handler"].append((start - claim_end) / 1e6)
        found["after return"].append((start - returned) / 1e6)
        found["total"].append((start - called) / 1e6)
    return found


def _load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--candidate", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--settle", type=float, default=1.0, help="idle seconds first")
    args = parser.parse_args()
    trees = {"baseline": args.baseline.resolve(), "candidate": args.candidate.resolve()}
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pgserver import PostgresServer

    found: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in trees}
    load_start = _load()
    server = PostgresServer(durable=True).start()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for round_ in range(args.rounds):
                order = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
                for name in order:
                    database = f"stages_{round_}_{name}"
                    server.create_database(database)
                    out = f"{scratch}/{database}.json"
                    command = [sys.executable, __file__, "publish", server.url(database)]
                    command += [str(args.messages), str(args.rate), str(args.settle), out]
                    env = {**os.environ, "PYTHONPATH": f"{trees[name]}/src"}
                    subprocess.run(command, env=env, check=True)
                    server.drop_database(database, missing_ok=True)
                    for stage, values in stages(json.loads(Path(out).read_text())).items():
                        found[name][stage] += values
                print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
    finally:
        server.stop()
    print(f"{args.rounds} rounds × {args.messages} messages at {args.rate:g}/s per tree;")
    print(f"load average {load_start} at the start, {_load()} at the end\n")
    print(
        "| stage (ms) | baseline p50 | candidate p50 | baseline p90 | candidate p90"
        " | baseline p99 | candidate p99 |"
    )
    print("|---|---|---|---|---|---|---|")
    for stage in STAGES:
        cells = []
        for fraction in (0.5, 0.9, 0.99):
            for name in trees:
                values = found[name][stage]
                cells.append(f"{percentile(values, fraction):.3f}" if values else "–")
        print(f"| {stage} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "consume":
        consume(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) > 1 and sys.argv[1] == "publish":
        publish(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
    else:
        main()
