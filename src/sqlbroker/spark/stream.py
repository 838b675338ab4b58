"""``spark.readStream.format("sqlbroker")``: a subscription as a Structured Streaming source.

Offsets are claim sequence numbers of a named stream (option ``stream``, by default the
subscription's name). ``latestOffset`` claims up to ``max_batch`` messages like any worker
would, snapshots them under the next sequence number and returns it; ``read`` reads a
sequence range back from the snapshot, so a batch replayed after a restart sees exactly the
same rows; ``commit`` acknowledges them. A keeper thread on the driver extends the leases of
every claim not yet acknowledged, so they stay valid while a batch is in flight.

Spark asks for the latest offset only between micro-batches, so when that call finds the
queue idle, the batch before it is done: it is acknowledged then, instead of waiting for a
``commit`` that only the next batch would bring.

Delivery into the sink is at least once: a claim snapshotted but not yet acknowledged when
the query dies is read again after the restart; it may also reach an ordinary worker if the
query stays down longer than the lease.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from sqlbroker.app import Broker
from sqlbroker.core.topics import validate_topic
from sqlbroker.spark import options as opt
from sqlbroker.spark.storage import SparkStore

DEFAULT_MAX_BATCH = 50_000
"""Large enough that Spark's fixed cost per micro-batch is small beside its rows; a trickle
makes small batches anyway (a batch takes what is available, up to ``max_batch``)."""
MAX_BATCH = 10_000_000
CLAIM_PAGE = 1_000
"""Messages claimed per transaction: a larger batch is claimed in pages, each under a
sequence number of its own, so no transaction holds the claim of a whole large batch."""
DEFAULT_LEASE = 300.0
DEFAULT_PARTITIONS = 2


def stream_settings(options: Mapping[str, str]) -> tuple[int, float, int]:
    """``max_batch``, ``lease`` and ``partitions`` of a stream, checked."""
    return (
        opt.integer(options, "max_batch", DEFAULT_MAX_BATCH, minimum=1, maximum=MAX_BATCH),
        opt.number(options, "lease", DEFAULT_LEASE, minimum=5.0, maximum=86_400.0),
        opt.integer(options, "partitions", DEFAULT_PARTITIONS, minimum=1, maximum=1_000),
    )


@dataclass
class ClaimSlice(InputPartition):
    """The claims ``after_seq < seq <= upto_seq`` whose delivery id is ``part`` mod ``parts``."""

    after_seq: int
    upto_seq: int
    part: int
    parts: int


def _seq(offset: Any) -> int:
    return int(offset["seq"])


class SubscriptionStreamReader(DataSourceStreamReader):
    """Claims in ``latestOffset``, reads by claim sequence, acknowledges in ``commit``."""

    def __init__(self, options: dict[str, str]) -> None:
        self.connection = opt.Connection.of(options)
        self.subscription = validate_topic(opt.required(options, "subscription"), "subscription")
        self.stream = validate_topic(opt.text(options, "stream", self.subscription), "stream")
        self.max_batch, self.lease, self.parts = stream_settings(options)
        self.worker = f"spark:{self.stream}:{Broker.worker_name()}"
        # Last: the options are all valid before the database is opened.
        self.connection = self.connection.bind()
        self._reset()

    def _reset(self) -> None:
        self._broker: Broker | None = None
        self._store: SparkStore | None = None
        self._initial: int | None = None
        self._handed_out: int | None = None
        self._acked = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors need the options only; connections and threads stay on the driver.
        return {
            name: value
            for name, value in self.__dict__.items()
            if name
            in ("connection", "subscription", "stream", "max_batch", "lease", "parts", "worker")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # --- the driver ---------------------------------------------------------------------------

    def _open(self) -> SparkStore:
        if self._store is None:
            self._broker, self._store = self.connection.open()
            _, self._acked = self._store.stream_open(
                stream=self.stream, subscription=self.subscription
            )
        return self._store

    def initialOffset(self) -> dict[str, int]:
        """Where a query with a fresh checkpoint starts: after the last acknowledged claim,
        so claims a previous query left unacknowledged are read first."""
        if self._initial is None:
            self._open()
            self._initial = self._acked
        return {"seq": self._initial}

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, int]:
        store = self._open()
        count = self.max_batch
        rows = getattr(limit, "max_rows", None) or getattr(limit, "maxRows", None)
        if isinstance(rows, int) and rows > 0:
            count = min(count, rows)
        with self._lock:
            latest = None
            while count > 0:
                page = min(count, CLAIM_PAGE)
                claimed = store.stream_claim(
                    stream=self.stream,
                    subscription=self.subscription,
                    limit=page,
                    lease=self.lease,
                    worker=self.worker,
                )
                if claimed == latest:
                    break  # the previous page emptied the queue
                latest = claimed
                count -= page
            assert latest is not None
            # Spark asks for the next offset only once the batch ending at start is in
            # the sink: when there is nothing after it, that batch is done.
            if start is not None and latest == _seq(start):
                self._ack(latest)
            self._handed_out = latest
        self._start_keeper()
        return {"seq": latest}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ClaimSlice]:
        after, upto = _seq(start), _seq(end)
        if upto <= after:
            return []
        return [ClaimSlice(after, upto, part, self.parts) for part in range(self.parts)]

    def commit(self, end: dict[str, Any]) -> None:
        self._open()
        with self._lock:
            self._ack(_seq(end))

    def _ack(self, upto: int) -> None:
        if upto > self._acked:
            assert self._store is not None
            self._store.stream_ack(stream=self.stream, upto_seq=upto)
            self._acked = upto

    def _start_keeper(self) -> None:
        if self._keeper is None:
            self._keeper = threading.Thread(
                target=self._keep_leases, name=f"sqlbroker-lease-keeper-{self.stream}", daemon=True
            )
            self._keeper.start()

    def _keep_leases(self) -> None:
        while not self._stop.wait(self.lease / 3):
            with self._lock:
                if self._store is None or self._handed_out is None:
                    continue
                # A failed round (database unreachable) is retried a third of a lease later.
                with contextlib.suppress(Exception):
                    self._store.stream_extend(
                        stream=self.stream, upto_seq=self._handed_out, lease=self.lease
                    )

    def stop(self) -> None:
        self._stop.set()
        if self._broker is not None:
            self._broker.close()
        self._broker = None
        self._store = None

    # --- the executors -----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ClaimSlice)
        with self.connection.session() as (_, store):  # the identity check, before any row
            yield from store.stream_batches(
                stream=self.stream,
                after_seq=partition.after_seq,
                upto_seq=partition.upto_seq,
                part=partition.part,
                parts=partition.parts,
            )
