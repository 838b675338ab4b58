"""Batch reads of PostgreSQL through ADBC: the server's rows arrive as Arrow batches and go
to Spark without a Python object per value. Used when ``adbc-driver-postgresql`` is
installed (the ``spark`` extra); otherwise reads go through the storage backend."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache

import pyarrow as pa

from sqlbroker.core.errors import InvalidOption
from sqlbroker.spark.schema import arrow_schema
from sqlbroker.storage.spark_base import SparkRowFilter
from sqlbroker.storage.spark_rows import SPARK_COLUMNS
from sqlbroker.storage.sql import load_blocks

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9999, 1, 1, tzinfo=UTC)


def available(url: str) -> bool:
    """Whether ``url`` is PostgreSQL and the ADBC driver is installed."""
    return url.startswith(("postgresql:", "postgres:")) and (
        importlib.util.find_spec("adbc_driver_postgresql") is not None
    )


@cache
def _queries(schema: str | None) -> dict[str, str]:
    if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
        raise InvalidOption("schema", "must be a lowercase SQL identifier")
    qualifier = "" if schema is None else f'"{schema}".'
    return load_blocks("sqlbroker.spark", "adbc_postgresql.sql", schema=qualifier)


def read_range(
    url: str, schema: str | None, where: SparkRowFilter, after_id: int, upto_id: int
) -> Iterator[pa.RecordBatch]:
    """The selected rows with ``after_id < id <= upto_id``, as batches of the table's
    Arrow schema."""
    import adbc_driver_postgresql.dbapi as adbc

    if where.min_id is not None:
        after_id = max(after_id, where.min_id - 1)
    if where.max_id is not None:
        upto_id = min(upto_id, where.max_id)
    target = arrow_schema(SPARK_COLUMNS[where.table])
    parameters = (
        where.subscription or "",
        where.topic_regex or "",
        where.since or _EARLIEST,
        where.until or _LATEST,
        after_id,
        upto_id,
    )
    with adbc.connect(url) as conn, conn.cursor() as cursor:
        cursor.execute(_queries(schema)[f"{where.table}_read"], parameters)
        for batch in cursor.fetch_record_batch():
            if batch.num_rows:
                yield batch.cast(target)
