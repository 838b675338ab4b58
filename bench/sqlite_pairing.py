"""Settle 500 leased copies on SQLite through the seam, for a same-run comparison of two
trees (the SQL that pairs ids with tokens, reasons and errors is what differs):

    python bench/sqlite_pairing.py OLD_TREE/src
    python bench/sqlite_pairing.py NEW_TREE/src
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

sys.path.insert(0, sys.argv[1])

from sqlbroker import Broker
from sqlbroker.core.settlements import Lease, Settlement

ROUNDS, BATCH = 7, 500
broker = Broker(f"sqlite:///{tempfile.mkdtemp()}/pairing.db")
broker.send("jobs", {"warm": True})
backend = broker.backend
times = []
for _ in range(ROUNDS):
    broker.publish_many([{"topic": "jobs", "payload": {"i": i}} for i in range(BATCH)])
    leased = backend.message_claim_many(subscription="jobs", limit=BATCH, lease=60, worker=None)
    started = time.perf_counter()
    backend.message_settle_many(settlements=[Settlement.complete(Lease.of(d)) for d in leased])
    times.append(time.perf_counter() - started)
median = statistics.median(times) * 1000
print(f"{sys.argv[1]}: settle {len(leased)} completes, median {median:.1f} ms")
