"""sqlbroker on Spark: the ``sqlbroker`` PySpark data source and the archive pipeline.

Needs the ``spark`` extra (``pip install 'sqlbroker[spark]'``). Call :func:`register` once
per SparkSession, then use ``format("sqlbroker")`` for reads, writes and streams.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register ``format("sqlbroker")`` with ``spark`` (a SparkSession)."""
    from sqlbroker.spark.source import SqlbrokerDataSource

    spark.dataSource.register(SqlbrokerDataSource)
