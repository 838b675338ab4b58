"""The archive export: archive and dead letters older than a cutoff into Parquet, verified
against the database, and only then deleted from it, all or nothing.

Layout under the export root::

    archive/date=YYYY-MM-DD/topic=T/<run>-part-….parquet    finished copies
    dead/date=YYYY-MM-DD/topic=T/<run>-part-….parquet       dead letters
    _staging/<run>/…                                        a run not yet published

A run reads the database once: its Parquet write counts the rows it reads, with the sums
of their ids and of a hash of each row, in the same Spark job. It writes into
``_staging/<run>``, reads the written files back in full and checks them against that count
(the files hold exactly what was read) and, topic by topic, against the range the delete
will remove, counted in SQL (count, sum, smallest and largest id: the files hold exactly
the database's rows). Then it deletes exactly the exported rows and records the run in one
transaction (which counts the rows again), and moves its files into place. A run that dies
before that transaction deleted nothing: the next run discards its staging directory and
exports the rows again. A run that dies after it is recognised by its record, and the next
run finishes moving its files. So no row is ever both deleted and missing from the Parquet.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlbroker.core.errors import SqlbrokerError
from sqlbroker.spark.options import Connection
from sqlbroker.spark.storage import ExportRun, SparkRowFilter, SparkStore
from sqlbroker.spark.storage.columns import EXPORTED_TABLES, TABLE_SOURCES

TIME_COLUMN = {table: TABLE_SOURCES[table][1] for table in EXPORTED_TABLES}
CHECKSUM_COLUMNS = ("id", "message_id", "topic", "payload", "attempts", "enqueued_at")

Step = Callable[[str], None]


class ExportMismatch(SqlbrokerError):
    """The written Parquet differs from the database: nothing was deleted."""


@dataclass(frozen=True, slots=True)
class PartitionCheck:
    table: str
    date: str
    topic: str
    rows: int
    checksum: str


@dataclass
class ExportResult:
    run_id: str
    root: str
    cutoff: datetime
    archive_rows: int = 0
    dead_rows: int = 0
    deleted: bool = False
    partitions: list[PartitionCheck] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "root": self.root,
            "cutoff": self.cutoff.isoformat(),
            "archive_rows": self.archive_rows,
            "dead_rows": self.dead_rows,
            "deleted": self.deleted,
            "recovered_runs": self.recovered,
            "discarded_runs": self.discarded,
            "partitions": [
                {"table": p.table, "date": p.date, "topic": p.topic, "rows": p.rows}
                for p in self.partitions
            ],
        }


def _row_hash() -> Any:
    """A 64-bit hash of each row's exported content, as a number that sums without
    overflowing."""
    from pyspark.sql import functions as F

    return F.xxhash64(*[F.col(c) for c in CHECKSUM_COLUMNS]).cast("decimal(38,0)")


@dataclass(frozen=True, slots=True)
class _Totals:
    """Rows counted with the sum of their ids and of their row hashes."""

    rows: int
    id_sum: int
    checksum: int


def _sums() -> list[Any]:
    """The aggregates of :class:`_Totals`: ``rows``, ``id_sum`` and ``checksum``."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.col("id").cast("decimal(38,0)")).alias("id_sum"),
        F.sum(_row_hash()).alias("checksum"),
    ]


def _totals(found: Any) -> _Totals:
    """The :class:`_Totals` of a row of :func:`_sums` (of no rows: zeros)."""
    return _Totals(
        rows=int(found["rows"] or 0),
        id_sum=int(found["id_sum"] or 0),
        checksum=int(found["checksum"] or 0),
    )


def _observed(frame: Any, name: str) -> tuple[Any, Any]:
    """``frame`` counted as an action (the Parquet write) passes its rows through, in that
    same job: no second read of the database."""
    from pyspark.sql import Observation

    observation = Observation(name)
    return frame.observe(observation, *_sums()), observation


def _file_totals(frame: Any) -> dict[tuple[str, str], tuple[_Totals, int, int]]:
    """Per (date, topic) of the written files: their totals, smallest and largest id."""
    from pyspark.sql import functions as F

    rows = (
        frame.groupBy(F.col("date").cast("string").alias("date"), F.col("topic"))
        .agg(*_sums(), F.min("id").alias("low"), F.max("id").alias("high"))
        .collect()
    )
    return {(r["date"], r["topic"]): (_totals(r), int(r["low"]), int(r["high"])) for r in rows}


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
CONCURRENT_WRITERS = "spark.sql.maxConcurrentOutputFileWriters"
DEFAULT_WRITERS = 64
"""Parquet files a task of the export keeps open at once, one per (date, topic): up to this
many, a task writes its rows as they come instead of sorting them by date and topic first
(Spark's default, 0, always sorts); past it Spark falls back to sorting the rest."""


@contextmanager
def _setting(spark: Any, name: str, value: str) -> Iterator[None]:
    """A session setting changed for the duration of a Spark job, then put back."""
    previous = spark.conf.get(name, None)
    spark.conf.set(name, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(name)
        else:
            spark.conf.set(name, previous)


def read_parquet(spark: Any, path: str) -> Any:
    """An export directory as a DataFrame, its partition values kept as strings (a topic
    such as ``2024`` must not turn into a number)."""
    # Listing the files happens here, while the setting holds.
    with _setting(spark, "spark.sql.sources.partitionColumnTypeInference.enabled", "false"):
        return spark.read.parquet(path)


def _with_date(frame: Any, table: str) -> Any:
    from pyspark.sql import functions as F

    return frame.withColumn("date", F.date_format(F.col(TIME_COLUMN[table]), "yyyy-MM-dd"))


class ArchiveExport:
    """One export run against one database and one export root."""

    def __init__(
        self,
        spark: Any,
        *,
        url: str,
        root: str,
        partitions: int = 4,
        step: Step | None = None,
        backend_options: dict[str, str] | None = None,
    ) -> None:
        from sqlbroker.spark import register
        from sqlbroker.spark.files import Files

        register(spark)
        self.spark = spark
        self.url = url
        self.root = root.rstrip("/")
        self.partitions = partitions
        self.writers = DEFAULT_WRITERS
        self.step = step or (lambda _: None)
        self.options = {"url": url, **(backend_options or {})}
        self.files = Files(spark, self.root)

    def _read(self, table: str, cutoff: datetime, max_id: int) -> Any:
        reader = self.spark.read.format("sqlbroker")
        for name, value in self.options.items():
            reader = reader.option(name, value)
        return (
            reader.option("table", table)
            .option("until", cutoff.isoformat())
            .option("max_id", str(max_id))
            .option("partitions", str(self.partitions))
            .load()
        )

    def run(self, *, cutoff: datetime, delete: bool = True) -> ExportResult:
        with Connection.of(self.options).session() as (broker, store):
            result = ExportResult(
                run_id=_run_id(broker.backend.now()), root=self.root, cutoff=cutoff
            )
            self.step("recovering earlier runs")
            self._recover(store, result)
            ranges = {}
            for table in TIME_COLUMN:
                found = store.id_range(where=SparkRowFilter(table=table, until=cutoff))
                ranges[table] = (found.high, found.count) if found else (0, 0)
            result.archive_rows = ranges["archive"][1]
            result.dead_rows = ranges["dead"][1]
            staging = f"{self.root}/_staging/{result.run_id}"
            read: dict[str, _Totals] = {}
            for table, (max_id, count) in ranges.items():
                if count:
                    self.step(f"writing {count} {table} rows to Parquet")
                    frame, observation = _observed(
                        _with_date(self._read(table, cutoff, max_id), table),
                        f"sqlbroker export {result.run_id} {table}",
                    )
                    with _setting(self.spark, CONCURRENT_WRITERS, str(self.writers)):
                        (
                            frame.write.partitionBy("date", "topic")
                            .mode("error")
                            .parquet(f"{staging}/{table}")
                        )
                    read[table] = _totals(observation.get)
            self.step("verifying counts and checksums against the database")
            try:
                for table, (max_id, count) in ranges.items():
                    if count:
                        result.partitions += self._verify(
                            store, table, staging, cutoff, max_id, count, read[table]
                        )
            except ExportMismatch:
                # Nothing was deleted: the files are of no use, the next run exports anew.
                self.files.delete(staging)
                self._tidy()
                raise
            if not delete:
                self.files.delete(staging)
                self._tidy()
                return result
            self.step("deleting the exported rows from the database")
            store.export_commit(
                run=ExportRun(
                    run_id=result.run_id,
                    cutoff=cutoff,
                    archive_max_id=ranges["archive"][0],
                    dead_max_id=ranges["dead"][0],
                    archive_rows=result.archive_rows,
                    dead_rows=result.dead_rows,
                )
            )
            result.deleted = True
            self.step("publishing the Parquet files")
            self._publish(result.run_id)
            self._tidy()
            return result

    def _verify(
        self,
        store: SparkStore,
        table: str,
        staging: str,
        cutoff: datetime,
        max_id: int,
        count: int,
        read: _Totals,
    ) -> list[PartitionCheck]:
        """The written files, read back in full, hold exactly the rows the write read (count,
        ids and row hashes) and, topic by topic, exactly the rows the database holds now in
        the range the delete removes (count, sum, smallest and largest id)."""
        folder = f"{staging}/{table}"
        # No file at all (Spark cannot even infer a schema) is a mismatch like any other.
        parquet = any(name.endswith(".parquet") for name in self.files.files(folder))
        written = self._read_back(table, folder) if parquet else {}
        database = store.export_totals(table=table, cutoff=cutoff, max_id=max_id)
        topics: dict[str, tuple[int, int, int, int]] = {}
        for (_date, topic), (totals, low, high) in written.items():
            n, ids, lowest, highest = topics.get(topic, (0, 0, low, high))
            topics[topic] = (
                n + totals.rows,
                ids + totals.id_sum,
                min(lowest, low),
                max(highest, high),
            )
        files = _Totals(
            rows=sum(t.rows for t, _, _ in written.values()),
            id_sum=sum(t.id_sum for t, _, _ in written.values()),
            checksum=sum(t.checksum for t, _, _ in written.values()),
        )
        expected = {t: (d.rows, d.id_sum, d.low, d.high) for t, d in database.items()}
        if topics != expected or files != read or files.rows != count:
            differing = sorted(set(topics.items()) ^ set(expected.items()))[:5]
            raise ExportMismatch(
                f"the Parquet export of {table} differs from the database ({files.rows} rows"
                f" written, {read.rows} read, {count} expected; files and read"
                f" {'agree' if files == read else 'differ'}; first differing topics (rows, id"
                f" sum, lowest, highest id): {differing}); nothing was deleted"
            )
        return [
            PartitionCheck(
                table=table, date=date, topic=topic, rows=totals.rows, checksum=str(totals.checksum)
            )
            for (date, topic), (totals, _, _) in sorted(written.items())
        ]

    def _read_back(
        self, table: str, folder: str
    ) -> dict[tuple[str, str], tuple[_Totals, int, int]]:
        from pyspark.errors import PySparkException

        try:
            # A few dozen rows out of the aggregation: one shuffle partition, not hundreds.
            with _setting(self.spark, SHUFFLE_PARTITIONS, "1"):
                return _file_totals(read_parquet(self.spark, folder))
        except PySparkException as error:
            first = (str(error).strip() or type(error).__name__).splitlines()[0]
            raise ExportMismatch(
                f"the Parquet export of {table} could not be read back ({first});"
                " nothing was deleted"
            ) from None

    def _recover(self, store: SparkStore, result: ExportResult) -> None:
        for path in self.files.children(f"{self.root}/_staging"):
            run_id = path.rstrip("/").rsplit("/", 1)[-1]
            if store.export_done(run_id=run_id):
                self._publish(run_id)
                result.recovered.append(run_id)
            else:
                # Its delete never committed: the rows are still in the database.
                self.files.delete(path)
                result.discarded.append(run_id)

    def _tidy(self) -> None:
        """Remove ``_staging`` once no run is left in it."""
        if self.files.exists(f"{self.root}/_staging") and not self.files.children(
            f"{self.root}/_staging"
        ):
            self.files.delete(f"{self.root}/_staging")

    def _publish(self, run_id: str) -> None:
        staging = f"{self.root}/_staging/{run_id}"
        for source in self.files.files(staging):
            if not source.endswith(".parquet"):
                continue
            root, relative = source.split(f"/_staging/{run_id}/", 1)
            folder, name = relative.rsplit("/", 1)
            self.files.move(source, f"{root}/{folder}/{run_id}-{name}")
        self.files.delete(staging)


def _run_id(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]
