"""The Spark schema of each readable table, and turning storage columns into Arrow batches."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sqlbroker.spark.storage.base import Columns
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


def _time_array(values: list[Any]) -> pa.Array:
    if any(not isinstance(value, int | float) for value in values if value is not None):
        return pa.array(values, type=pa.timestamp("us", tz="UTC"))  # aware datetimes
    seconds = pa.array(values, type=pa.float64())
    micros = pc.round(pc.multiply(seconds, 1_000_000.0))
    return pc.cast(pc.cast(micros, pa.int64()), pa.timestamp("us", tz="UTC"))


def record_batch(columns: Columns, names: tuple[str, ...]) -> pa.RecordBatch:
    """An Arrow batch of storage columns; times arrive as float Unix seconds (SQLite) or
    aware datetimes (PostgreSQL)."""
    arrays = [
        _time_array(columns[name])
        if name in TIME_COLUMNS
        else pa.array(columns[name], type=_types(name)[0])
        for name in names
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(names))
