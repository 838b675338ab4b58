"""The Spark schema of each readable table, and turning SQLite rows into Arrow batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sqlbroker.spark.storage.columns import SPARK_COLUMNS, TIME_COLUMNS

_LONG = frozenset({"id", "delivery_id", "seq"})
_INT = frozenset({"priority", "attempts", "max_attempts", "replay_count"})
_BINARY = frozenset({"payload"})


def _types(column: str) -> tuple[pa.DataType, str]:
    """The Arrow type and the Spark SQL type of a column."""
    if column in _LONG:
        return pa.int64(), "BIGINT"
    if column in _INT:
        return pa.int32(), "INT"
    if column in _BINARY:
        return pa.binary(), "BINARY"
    if column in TIME_COLUMNS:
        return pa.timestamp("us", tz="UTC"), "TIMESTAMP"
    return pa.string(), "STRING"


def _ddl(columns: tuple[str, ...]) -> str:
    return ", ".join(f"{name} {_types(name)[1]}" for name in columns)


TABLE_SCHEMAS: dict[str, str] = {table: _ddl(cols) for table, cols in SPARK_COLUMNS.items()}
"""Spark DDL schema of a batch read of each table."""


def arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    return pa.schema([pa.field(name, _types(name)[0]) for name in columns])


def record_batch(rows: Sequence[Sequence[Any]], names: tuple[str, ...]) -> pa.RecordBatch:
    """An Arrow batch of SQLite rows (at least one) of the columns ``names``; times arrive
    as float Unix seconds."""
    arrays = []
    for name, values in zip(names, zip(*rows, strict=True), strict=True):
        if name in TIME_COLUMNS:
            micros = pc.round(pc.multiply(pa.array(values, type=pa.float64()), 1_000_000.0))
            arrays.append(pc.cast(pc.cast(micros, pa.int64()), pa.timestamp("us", tz="UTC")))
        else:
            arrays.append(pa.array(values, type=_types(name)[0]))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(names))
