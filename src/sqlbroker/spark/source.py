"""The ``sqlbroker`` PySpark data source: batch reads, idempotent batch writes, streaming.

Register it once per session with :func:`sqlbroker.spark.register`, then use
``spark.read.format("sqlbroker")``, ``df.write.format("sqlbroker")`` and
``spark.readStream.format("sqlbroker")``. Options are documented in ``docs/spark.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from sqlbroker.spark import options as opt
from sqlbroker.spark.schema import TABLE_SCHEMAS
from sqlbroker.spark.storage import SparkRowFilter
from sqlbroker.spark.write import message_writer

DEFAULT_PARTITIONS = 4
DEFAULT_FETCH = 10_000


@dataclass
class IdSlice(InputPartition):
    """Rows with ``after_id < id <= upto_id``."""

    after_id: int
    upto_id: int


def read_settings(options: Mapping[str, str]) -> tuple[int, int, int | None, int | None]:
    """``partitions``, ``fetch_size``, ``min_id`` and ``max_id`` of a batch read, checked
    (an id bound not given: ``None``)."""
    return (
        opt.integer(options, "partitions", DEFAULT_PARTITIONS, minimum=1, maximum=10_000),
        opt.integer(options, "fetch_size", DEFAULT_FETCH, minimum=1, maximum=1_000_000),
        opt.integer(options, "min_id", 0, minimum=0, maximum=2**63 - 1) or None,
        opt.integer(options, "max_id", 0, minimum=0, maximum=2**63 - 1) or None,
    )


class MessagesReader(DataSourceReader):
    """A batch read of one table, split into id ranges read in parallel."""

    def __init__(self, options: dict[str, str]) -> None:
        self.connection = opt.Connection.of(options)
        self.parts, self.fetch, low, high = read_settings(options)
        self.where: SparkRowFilter = replace(opt.row_filter(options), min_id=low, max_id=high)
        # Last: the options are all valid before the database is opened.
        self.connection = self.connection.bind()

    def partitions(self) -> list[IdSlice]:
        with self.connection.session() as (_, store):
            found = store.id_range(where=self.where)
        if found is None:
            return [IdSlice(0, 0)]
        first = found.low - 1
        width = max(1, -(-(found.high - first) // self.parts))
        return [
            IdSlice(start, min(start + width, found.high))
            for start in range(first, found.high, width)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IdSlice)
        if partition.upto_id <= partition.after_id:
            return
        with self.connection.session() as (_, store):  # the identity check, before any row
            yield from store.rows_read(
                where=self.where,
                after_id=partition.after_id,
                upto_id=partition.upto_id,
                fetch=self.fetch,
            )


def check_options(options: Mapping[str, str]) -> None:
    """Every option given, checked in form and range (the database is not opened)."""
    from sqlbroker.spark.stream import stream_settings

    opt.Connection.of(options)
    opt.row_filter(options)
    read_settings(options)
    if opt.text(options, "subscription") is not None:
        stream_settings(options)


class SqlbrokerDataSource(DataSource):
    """``format("sqlbroker")``: messages, archive and dead letters of a sqlbroker database."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # At load(), not when a task or a micro-batch first meets a bad option.
        check_options(self.options)

    @classmethod
    def name(cls) -> str:
        return "sqlbroker"

    def schema(self) -> str:
        """A batch read has the columns of its table; a streaming read, of messages."""
        return TABLE_SCHEMAS[opt.row_filter(self.options).table]

    def reader(self, schema: StructType) -> MessagesReader:
        return MessagesReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return message_writer(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from sqlbroker.spark.stream import SubscriptionStreamReader

        return SubscriptionStreamReader(dict(self.options))
