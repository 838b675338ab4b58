"""The report's charts (matplotlib, no SparkSession needed): one minute of data is drawn,
not a blank chart (issue 23 item 16)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("matplotlib")

from sqlbroker.spark.charts import _throughput


def _markers(svg: str) -> int:
    """How many round markers the SVG draws: matplotlib defines a marker once as a path
    (a circle is drawn with curves, a tick mark with straight lines) and places it with
    ``<use>``."""
    circles = re.findall(r'<path id="(m[0-9a-f]+)" d="M 0 [^"]*\bC ', svg)
    return sum(len(re.findall(rf'<use xlink:href="#{name}"', svg)) for name in circles)


def test_one_minute_of_throughput_is_drawn_as_points() -> None:
    rows = [
        {"minute": "2026-11-25 12:00", "topic": "orders.created", "messages": 42},
        {"minute": "2026-11-25 12:00", "topic": "emails", "messages": 7},
    ]
    assert _markers(_throughput(rows)) == 4  # each series: its point and its legend entry


def test_a_longer_history_is_drawn_as_lines() -> None:
    rows = [
        {"minute": f"2026-11-25 12:{m:02d}", "topic": "orders.created", "messages": m}
        for m in range(5)
    ]
    svg = _throughput(rows)
    assert _markers(svg) == 0
    assert "orders.created" in svg
