"""The PostgreSQL store of a Spark write, without Spark: staging and the driver's publish.

    PYTHONPATH=src .venv/bin/python bench/spark_stage_publish.py [--rows 40000]
        [--before /path/to/old/src] [--rounds 2]

What ``bench/spark_write.py`` times end to end, split into the store's two steps, for
the old tree and this one, interleaved, on one fresh PostgreSQL database each round:
``stage``: ``stage_insert`` of N validated messages in calls of 5,000, four "partitions"
(what the tasks do); ``publish``: ``stage_publish`` of the four winners in chunks of 5,000
(what the driver's commit does). The messages are built once per process (not timed).

Results go to ``bench/results/spark_stage_publish.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def child(url: str, rows: int, connections: int) -> dict[str, float]:
    import uuid

    import sqlbroker
    from sqlbroker.features.publishing import PublishDefaults, build_message
    from sqlbroker.spark.storage import open_store

    defaults = PublishDefaults(max_attempts=5, dedupe_window=86400.0, payload_limit=262144)
    messages = [
        build_message(
            "orders.created",
            {"order_id": n, "customer": f"customer-{n % 1000}", "amount": n * 0.25},
            defaults=defaults,
        )
        for n in range(rows)
    ]
    job = uuid.uuid4().hex
    with sqlbroker.Broker(url, migrate=True) as broker:
        broker.subscribe("bench", "orders.#")
        store = open_store(broker, url=url, options={})
        quarter = rows // 4
        started = time.perf_counter()
        for part in range(4):
            for start in range(0, quarter, 5_000):
                chunk = messages[
                    part * quarter + start : part * quarter + min(quarter, start + 5_000)
                ]
                store.stage_insert(
                    job=job, partition=part, attempt=part, first_seq=start, rows=chunk
                )
        staged = time.perf_counter()
        parallel = {"connections": connections} if connections > 1 else {}
        result = store.stage_publish(
            job=job,
            winners=[(p, p) for p in range(4)],
            key_prefix=f"b:{job}:",
            chunk=5_000,
            **parallel,
        )
        published = time.perf_counter()
    assert result.published == rows
    return {"stage_s": staged - started, "publish_s": published - staged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--before", help="the src/ directory of the old tree")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--connections", type=int, default=1, help="the publish's connections (this tree only)"
    )
    parser.add_argument("--out", default=str(RESULTS / "spark_stage_publish"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        print(json.dumps(child(arguments.child, arguments.rows, arguments.connections)), flush=True)
        return
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PostgresServer

    variants = {"after": str(REPO / "src")}
    if arguments.before:
        variants = {"before": arguments.before, **variants}
    runs: list[dict[str, Any]] = []
    server = PostgresServer(durable=True).start()
    try:
        number = 0
        for _ in range(arguments.rounds):
            for variant, src in variants.items():
                number += 1
                server.create_database(f"stage_{number}")
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--rows",
                        str(arguments.rows),
                        "--child",
                        str(server.url(f"stage_{number}")),
                        "--connections",
                        str(arguments.connections if variant == "after" else 1),
                    ],
                    env={**os.environ, "PYTHONPATH": src},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                run = json.loads(done.stdout.strip().splitlines()[-1])
                run.update(variant=variant, load_average=os.getloadavg()[0])
                print(json.dumps(run), flush=True)
                runs.append(run)
    finally:
        server.stop()
    results = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": arguments.rows,
        "runs": runs,
    }
    out = Path(arguments.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# The PostgreSQL store of a Spark write: staging and publish",
        "",
        f"{results['started']} · `bench/spark_stage_publish.py --rows {arguments.rows}`"
        " (2 cores shared with other work: compare the rows of one round)",
        "",
        "| tree | stage (s) | stage msg/s | publish (s) | publish msg/s | load (1 min) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['variant']} | {run['stage_s']:.2f} | {arguments.rows / run['stage_s']:,.0f} |"
            f" {run['publish_s']:.2f} | {arguments.rows / run['publish_s']:,.0f} |"
            f" {run['load_average']:.1f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
