"""A large DataFrame write beside another publisher: throughput, memory, lock hold.

    PYTHONPATH=src .venv/bin/python bench/spark_write.py [--rows 1000000]
        [--backends sqlite,postgresql] [--before /path/to/old/src]

For each backend (and, with ``--before``, for the old tree and this one, in one run), on a
fresh database: ``df.write.format("sqlbroker")`` of an N-row DataFrame (4 partitions) in a
process of its own with its own SparkSession, while this process

* publishes one message every 20 ms to the same database (the "other writer" of issue 28
  item 3) and records how long each publish took and whether it failed (``DatabaseBusy``):
  on SQLite, the longest publish is the longest time the write held the write lock;
* samples the resident memory of every Python process of the write (the driver, its
  Python workers, the commit) every 100 ms and keeps the largest.

Results go to ``bench/results/spark_write.json`` and ``bench/results/spark_write.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def messages_in_queue(broker: Any, url: str) -> int:
    """How many copies the queue holds (the Spark store's count of its ``messages`` table)."""
    from sqlbroker.spark.storage import SparkRowFilter, open_store

    found = open_store(broker, url=url, options={}).id_range(where=SparkRowFilter(table="messages"))
    return 0 if found is None else found.count


def child(url: str, rows: int) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from sqlbroker.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlbroker-spark-write-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    frame = spark.range(0, rows, 1, 4).select(
        F.col("id").alias("order_id"),
        F.concat(F.lit("customer-"), (F.col("id") % 1000).cast("string")).alias("customer"),
        (F.col("id") * 0.25).alias("amount"),
    )
    started = time.perf_counter()
    frame.write.format("sqlbroker").option("url", url).option("topic", "orders.created").mode(
        "append"
    ).save()
    print(json.dumps({"write_s": time.perf_counter() - started}), flush=True)
    spark.stop()


def _tree(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _python_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return 0
    if "python" not in fields.get("Name", "").lower():
        return 0
    return int(fields.get("VmRSS", "0 kB").split()[0]) * 1024


def _cpu_seconds(pid: int, *, with_reaped: bool = True, alone: bool = False) -> float:
    """CPU seconds of a process with the children it has reaped (as the postmaster reaps
    its backends), and unless ``alone`` of its live descendants."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for member in [pid] if alone else _tree(pid):
        try:
            with open(f"/proc/{member}/stat", encoding="utf-8") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
        if with_reaped and member == pid:
            total += (int(fields[13]) + int(fields[14])) / tick
    return total


def _postmaster(url: str) -> int | None:
    """The PostgreSQL server's postmaster, found by the port of ``url`` (None for SQLite)."""
    if not url.startswith("postgresql"):
        return None
    port = url.rsplit(":", 1)[1].split("/", 1)[0]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    words = cmdline.read().split(b"\0")
            except OSError:
                continue
            if (
                words
                and words[0].endswith(b"postgres")
                and f"port={port}".encode() in b" ".join(words)
            ):
                return int(entry)
    return None


def run_variant(url: str, src: str, rows: int) -> dict[str, Any]:
    import sqlbroker
    from sqlbroker.core.errors import DatabaseBusy

    with sqlbroker.Broker(url, migrate=True) as broker:
        broker.subscribe("bench", "orders.#")
    env = {**os.environ, "PYTHONPATH": src}
    postmaster = _postmaster(url)
    database_cpu = 0.0 if postmaster is None else _cpu_seconds(postmaster, with_reaped=True)
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", url, "--rows", str(rows)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    stop = threading.Event()
    peak = {"rss": 0}
    probe: dict[str, Any] = {"latencies": [], "busy": 0, "errors": 0}

    cpu: dict[int, float] = {}  # the last CPU seconds seen of each process of the write

    def sample() -> None:
        while not stop.wait(0.1):
            for pid in _tree(process.pid):
                peak["rss"] = max(peak["rss"], _python_rss(pid))
                seconds = _cpu_seconds(pid, with_reaped=False, alone=True)
                if seconds:
                    cpu[pid] = seconds

    def publish() -> None:
        with sqlbroker.Broker(url) as other:
            while not stop.wait(0.02):
                started = time.perf_counter()
                try:
                    other.publish("probe.ping", {"at": time.time()})
                except DatabaseBusy:
                    probe["busy"] += 1
                except sqlbroker.SqlbrokerError:
                    probe["errors"] += 1
                probe["latencies"].append(time.perf_counter() - started)

    threads = [threading.Thread(target=sample), threading.Thread(target=publish)]
    for thread in threads:
        thread.start()
    out, _ = process.communicate()
    spark_cpu = sum(cpu.values())
    if postmaster is not None:
        database_cpu = _cpu_seconds(postmaster, with_reaped=True) - database_cpu
    stop.set()
    for thread in threads:
        thread.join()
    if process.returncode != 0:
        raise RuntimeError(f"the write failed (exit {process.returncode})")
    write_s = json.loads(out.strip().splitlines()[-1])["write_s"]
    with sqlbroker.Broker(url) as broker:
        queued = messages_in_queue(broker, url)
    latencies = sorted(probe["latencies"])
    return {
        "write_s": round(write_s, 2),
        "write_msg_per_s": round(rows / write_s),
        "messages_in_queue": queued,
        "peak_python_rss_mib": round(peak["rss"] / 2**20),
        # CPU seconds over the write: the Spark job (its JVM, Python workers and the
        # driver's commit) and, on PostgreSQL, the server (every backend, the other
        # publisher's included).
        "spark_cpu_s": round(spark_cpu, 1),
        "database_cpu_s": round(database_cpu, 1) if postmaster is not None else None,
        "other_publisher": {
            "publishes": len(latencies),
            "busy_errors": probe["busy"],
            "other_errors": probe["errors"],
            "max_s": round(latencies[-1], 3) if latencies else None,
            "p99_s": round(latencies[int(len(latencies) * 0.99)], 3) if latencies else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--before", help="the src/ directory of the old tree")
    parser.add_argument("--rounds", type=int, default=1, help="before/after, interleaved")
    parser.add_argument("--out", default=str(RESULTS / "spark_write"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        child(arguments.child, arguments.rows)
        return
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PostgresServer

    variants = {"after": str(REPO / "src")}
    if arguments.before:
        variants = {"before": arguments.before, **variants}
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "rows": arguments.rows,
        "runs": [],
    }
    work = Path(tempfile.mkdtemp(prefix="sqlbroker-spark-write-"))
    server = None
    try:
        number = 0
        for backend in arguments.backends.split(","):
            for _round, (variant, src) in (
                (r, item) for r in range(arguments.rounds) for item in variants.items()
            ):
                number += 1
                index = number
                if backend == "sqlite":
                    url = f"sqlite:///{work}/write-{variant}.db"
                else:
                    if server is None:
                        server = PostgresServer(durable=True).start()
                    server.create_database(f"write_{index}")
                    url = str(server.url(f"write_{index}"))
                print(f"[{backend} {variant}] writing {arguments.rows:,} rows", flush=True)
                run = {"backend": backend, "variant": variant, "load_start": os.getloadavg()[0]}
                run.update(run_variant(url, src, arguments.rows))
                print(json.dumps(run), flush=True)
                results["runs"].append(run)
    finally:
        if server is not None:
            server.stop()
    results["load_average_end"] = os.getloadavg()
    out = Path(arguments.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# A large DataFrame write beside another publisher",
        "",
        f"{results['started']} · `bench/spark_write.py --rows {arguments.rows}` · load average"
        f" at end {', '.join(f'{x:.1f}' for x in results['load_average_end'])} (2 cores,"
        " shared with other work: compare only rows of this run)",
        "",
        "| backend | tree | write (s) | msg/s | CPU µs/row: Spark job | CPU µs/row: PostgreSQL"
        " | peak Python RSS (MiB) | other publisher: longest publish (s) | p99 (s) |"
        " DatabaseBusy | load (1 min) at start |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        other = run["other_publisher"]
        database = run["database_cpu_s"]
        lines.append(
            f"| {run['backend']} | {run['variant']} | {run['write_s']} |"
            f" {run['write_msg_per_s']:,} | {run['spark_cpu_s'] * 1e6 / arguments.rows:.0f} |"
            f" {'–' if database is None else f'{database * 1e6 / arguments.rows:.0f}'} |"
            f" {run['peak_python_rss_mib']:,} | {other['max_s']} |"
            f" {other['p99_s']} | {other['busy_errors']} | {run['load_start']:.1f} |"
        )
    lines += [
        "",
        "The write: N rows, 4 partitions, `local[2]`, staging on the executors and the driver's"
        " publish, until `save()` returned. Beside it, one publisher on the same database"
        " publishes a message every 20 ms; on SQLite its longest publish is the longest time"
        " the write held the write lock. Peak RSS: the largest Python process of the write.",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
