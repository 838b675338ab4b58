"""Load-independent counts of the SQLite drain (one thread looping claim -> complete), to
compare two trees on a busy machine: statements per call, SQLite engine steps per message
(the progress handler called at every step) and WAL frames per call (checkpoints off)::

    PYTHONPATH=OLD_TREE/src python bench/sqlite_drain_counts.py claim10 [messages]
    PYTHONPATH=NEW_TREE/src python bench/sqlite_drain_counts.py keyed10

Workloads: ``claimN`` (plain copies) and ``keyedN`` (64 ordering keys), N the claim limit.
Patches the pool's connection factory, so it runs on any tree since 325ed76.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sqlite3
import sys
import tempfile
from typing import Any

import sqlbroker
from sqlbroker.storage.sqlite import connection

WAL_FRAME = 4096 + 24
workload = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
limit = int(re.sub(r"\D", "", workload))
keyed = workload.startswith("keyed")

current: dict[str, Any] = {"op": "", "statement": ("", ""), "counting": False}
steps: collections.Counter[tuple[str, str]] = collections.Counter()
statements: collections.Counter[str] = collections.Counter()


def traced(sql: str) -> None:
    if not current["counting"]:
        return
    op = str(current["op"])
    current["statement"] = (op, re.sub(r"\s+", " ", sql)[:70])
    statements[op] += 1


def stepped() -> int:
    if current["counting"]:
        steps[current["statement"]] += 1
    return 0


opened = connection.SqlitePool._connect


def counted(self: Any) -> sqlite3.Connection:
    conn = opened(self)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.set_trace_callback(traced)
    conn.set_progress_handler(stepped, 1)
    return conn


connection.SqlitePool._connect = counted  # type: ignore[method-assign]


def payload(i: int) -> dict[str, Any]:
    return {"seq": i, "t": 0.0, "kind": "bench", "body": "x" * 150}


path = os.path.join(tempfile.mkdtemp(), "drain.db")
with sqlbroker.Broker(f"sqlite:///{path}", migrate=True, synchronous="full") as broker:
    if keyed:
        for k in range(64):
            broker.send_many("bench", [payload(i) for i in range(k, count, 64)], key=f"k{k}")
    else:
        for start in range(0, count, 1000):
            broker.send_many("bench", [payload(i) for i in range(start, min(count, start + 1000))])
    checkpoint = sqlite3.connect(path)
    checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    checkpoint.close()
    broker.stats()

    def wal() -> int:
        return os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0

    frames: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    done = 0
    current["counting"] = True
    while True:
        current["op"], before = "claim", wal()
        deliveries = broker.claim("bench", limit=limit)
        frames["claim"] += wal() - before
        calls["claim"] += 1
        if not deliveries:
            break
        current["op"], before = "complete", wal()
        broker.complete(deliveries)
        frames["complete"] += wal() - before
        calls["complete"] += 1
        done += len(deliveries)
    current["counting"] = False
if done != count:
    raise SystemExit(f"drained {done} of {count}")
report: dict[str, Any] = {"workload": workload, "messages": done}
for op in ("claim", "complete"):
    report[op] = {
        "calls": calls[op],
        "statements_per_call": round(statements[op] / calls[op], 2),
        "steps_per_message": round(sum(n for (o, _), n in steps.items() if o == op) / done, 1),
        "wal_frames_per_call": round(frames[op] / WAL_FRAME / calls[op], 2),
    }
print(json.dumps(report))
if os.environ.get("DETAIL"):
    for (op, statement), n in steps.most_common():
        print(f"  {op:8} {n / done:8.1f} steps/msg  {statement}")
