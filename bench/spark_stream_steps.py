"""Where a stream's micro-batch spends its time, step by step, without Spark.

    PYTHONPATH=src .venv/bin/python bench/spark_stream_steps.py [--rows 200000]
        [--batch 50000] [--pages 1000,10000] [--backends sqlite,postgresql] [--explain]

On a fresh database holding ``--rows`` messages, the steps of the stream's micro-batches
run as the Spark source runs them, each timed: the claim (``latestOffset``: pages of the
broker's claim, each with its snapshot), the executors' read of each partition (opening
the checked connection, the read, the Arrow batch) and the acknowledgement (``commit``:
the leases read back, the broker's settle, the claims forgotten). Spark itself is not
started: what is left of a micro-batch's time in ``bench/spark_stream.py`` is Spark's.
``--explain`` logs every PostgreSQL statement over 20 ms with its plan (auto_explain) and
prints them. Prints one JSON line per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
QUEUE = "bench"
STREAM = "steps"


def fill(url: str, rows: int) -> None:
    import sqlbroker

    with sqlbroker.Broker(url, migrate=True) as broker:
        for start in range(0, rows, 5_000):
            broker.send_many(
                QUEUE,
                [
                    {"order_id": n, "customer": f"c-{n}"}
                    for n in range(start, min(rows, start + 5_000))
                ],
            )


def drain(url: str, batch: int, page: int, parts: int) -> list[dict[str, Any]]:
    from sqlbroker.core.settlements import Settlement
    from sqlbroker.spark import options as opt

    connection = opt.Connection.of({"url": url}).bind()
    broker, store = connection.open()
    last, _ = store.stream_open(stream=STREAM, subscription=QUEUE)
    batches = []
    try:
        while True:
            steps: dict[str, float] = {}
            started = time.perf_counter()
            count, latest = batch, None
            while count > 0:
                claimed = store.stream_claim(
                    stream=STREAM,
                    subscription=QUEUE,
                    limit=min(count, page),
                    lease=300.0,
                    worker="steps",
                )
                if claimed == latest:
                    break
                latest = claimed
                count -= page
            steps["claim"] = time.perf_counter() - started
            assert latest is not None
            if latest == last:
                break
            rows = 0
            for part in range(parts):
                mark = time.perf_counter()
                reader, part_store = connection.open()
                steps[f"read{part}_open"] = time.perf_counter() - mark
                mark = time.perf_counter()
                got = list(
                    part_store.stream_batches(
                        stream=STREAM, after_seq=last, upto_seq=latest, part=part, parts=parts
                    )
                )
                steps[f"read{part}_arrow"] = time.perf_counter() - mark
                rows += sum(b.num_rows for b in got)
                reader.close()
            mark = time.perf_counter()
            leases = store._stream_leases(STREAM, latest)
            steps["ack_leases"] = time.perf_counter() - mark
            mark = time.perf_counter()
            done = broker.backend.message_settle_many(
                settlements=[Settlement.complete(lease) for lease in leases]
            )
            steps["ack_settle"] = time.perf_counter() - mark
            mark = time.perf_counter()
            with store._write() as conn:  # the rest of stream_ack
                params = {"stream": STREAM, "upto_seq": latest}
                conn.execute(store._sql["stream_forget"], params)
                conn.execute(store._sql["stream_acked"], params)
            steps["ack_forget"] = time.perf_counter() - mark
            steps["total"] = time.perf_counter() - started
            batches.append(
                {
                    "rows": rows,
                    "settled": len(done),
                    "pages": latest - last,
                    **{k: round(v, 3) for k, v in steps.items()},
                }
            )
            print(json.dumps(batches[-1]), flush=True)
            last = latest
    finally:
        broker.close()
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--pages", default="1000")
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--explain", action="store_true")
    arguments = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PostgresServer

    work = Path(tempfile.mkdtemp(prefix="sqlbroker-stream-steps-"))
    server = None
    try:
        for backend in arguments.backends.split(","):
            for index, page in enumerate(int(p) for p in arguments.pages.split(",")):
                if backend == "sqlite":
                    url = f"sqlite:///{work}/steps-{index}.db"
                else:
                    if server is None:
                        settings = {}
                        if arguments.explain:
                            settings = {
                                "session_preload_libraries": "auto_explain",
                                "auto_explain.log_min_duration": "20ms",
                                "auto_explain.log_analyze": "on",
                                "auto_explain.log_nested_statements": "on",
                            }
                        server = PostgresServer(durable=True, settings=settings).start()
                    server.create_database(f"steps_{index}")
                    url = str(server.url(f"steps_{index}"))
                fill(url, arguments.rows)
                print(f"# {backend} page {page} load {os.getloadavg()[0]:.1f}", flush=True)
                offset = server.log_path.stat().st_size if server is not None else 0
                drain(url, arguments.batch, page, arguments.parts)
                if arguments.explain and server is not None:
                    with server.log_path.open(encoding="utf-8", errors="replace") as log:
                        log.seek(offset)
                        print(log.read())
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
