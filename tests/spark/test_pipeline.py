"""The archive pipeline: export to Parquet, verify, delete all or nothing, and report."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import sqlbroker
from sqlbroker.spark import report as reports
from sqlbroker.spark.export import ArchiveExport, ExportMismatch

pytestmark = pytest.mark.spark


class Died(Exception):
    """Stands for the pipeline process dying at a given step."""


def _history(broker: sqlbroker.Broker, clock: sqlbroker.ManualClock) -> dict[str, int]:
    """Old traffic two days ago and fresh traffic now; returns the old row counts."""
    broker.subscribe("billing", "orders.#")
    broker.subscribe("mail", "mail.#")
    broker.publish_many(
        [{"topic": "orders.created", "payload": {"n": n}} for n in range(40)]
        + [{"topic": "mail.sent", "payload": {"n": n}} for n in range(20)]
    )
    clock.advance(2.0)
    billing = broker.claim("billing", limit=40)
    broker.complete(billing[:34])
    for delivery in billing[34:]:
        broker.dead_letter(delivery, reason="card declined", error=ValueError("declined"))
    clock.advance(60.0)
    mail = broker.claim("mail", limit=20)
    broker.complete(mail[:18])
    for delivery in mail[18:]:
        broker.dead_letter(delivery, reason="mailbox full")
    clock.advance(2 * 86400.0)
    broker.publish_many([{"topic": "orders.created", "payload": {"n": n}} for n in range(5)])
    broker.complete(broker.claim("billing", limit=5))
    return {"archive": 34 + 18, "dead": 6 + 2}


@pytest.fixture
def history(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> tuple[sqlbroker.Broker, dict[str, int]]:
    return clocked_broker, _history(clocked_broker, clock)


def _exporter(spark: Any, broker: sqlbroker.Broker, root: Path, **options: Any) -> ArchiveExport:
    return ArchiveExport(spark, url=broker.url, root=str(root), partitions=2, **options)


def _parquet_ids(spark: Any, root: Path, table: str) -> list[int]:
    return [row.id for row in spark.read.parquet(str(root / table)).select("id").collect()]


def test_export_verifies_then_deletes_and_reports(
    spark: Any, history: tuple[sqlbroker.Broker, dict[str, int]], tmp_path: Path
) -> None:
    broker, old = history
    root = tmp_path / "export"
    cutoff = broker.backend.now() - timedelta(days=1)
    result = _exporter(spark, broker, root).run(cutoff=cutoff)

    assert (result.archive_rows, result.dead_rows, result.deleted) == (old["archive"], 8, True)
    assert sorted({(p.table, p.topic) for p in result.partitions}) == [
        ("archive", "mail.sent"),
        ("archive", "orders.created"),
        ("dead", "mail.sent"),
        ("dead", "orders.created"),
    ]
    assert len(_parquet_ids(spark, root, "archive")) == old["archive"]
    assert len(_parquet_ids(spark, root, "dead")) == old["dead"]
    # Only the fresh rows stay in the database.
    assert len(broker.archive(limit=1000)) == 5
    assert broker.dead_letters.list() == []
    assert not (root / "_staging").exists()
    assert list((root / "archive").glob("date=*/topic=orders.created/*.parquet"))
    payloads = spark.read.parquet(str(root / "archive")).select("payload").collect()
    assert sorted(json.loads(bytes(r.payload))["n"] for r in payloads)[:3] == [0, 0, 1]

    # Nothing old is left: a second run exports nothing and deletes nothing.
    again = _exporter(spark, broker, root).run(cutoff=cutoff)
    assert (again.archive_rows, again.dead_rows) == (0, 0)
    assert len(_parquet_ids(spark, root, "archive")) == old["archive"]

    computed = reports.compute(spark, str(root))
    summary = computed.summary
    assert (summary["completed"], summary["dead"], summary["topics"]) == (52, 8, 2)
    assert summary["dlq_rate"] == pytest.approx(8 / 60, abs=1e-6)
    latency = {r["topic"]: r for r in computed.tables["latency"]}
    assert latency["orders.created"]["p50_s"] == pytest.approx(2.0, abs=0.01)
    assert latency["mail.sent"]["p99_s"] == pytest.approx(62.0, abs=0.01)
    reasons = computed.tables["failure_reasons"]
    assert (reasons[0]["reason"], reasons[0]["messages"]) == ("card declined", 6)
    assert {r["attempts"] for r in computed.tables["attempts"]} == {1}
    assert sum(r["messages"] for r in computed.tables["throughput"]) == 52

    page = reports.write(computed, tmp_path / "report")
    text = page.read_text()
    assert text.count("<svg") == 5
    assert "card declined" in text
    folder = tmp_path / "report"
    assert (folder / "throughput.csv").read_text().startswith("minute,topic,messages")
    assert json.loads((folder / "report.json").read_text())["summary"]["dead"] == 8


def test_a_run_dying_before_the_delete_deletes_nothing_and_the_next_completes(
    spark: Any, history: tuple[sqlbroker.Broker, dict[str, int]], tmp_path: Path
) -> None:
    broker, old = history
    root = tmp_path / "export"
    cutoff = broker.backend.now() - timedelta(days=1)

    def die_before_delete(step: str) -> None:
        if step.startswith("deleting"):
            raise Died(step)

    with pytest.raises(Died):
        _exporter(spark, broker, root, step=die_before_delete).run(cutoff=cutoff)
    assert len(broker.archive(limit=1000)) == old["archive"] + 5
    assert len(broker.dead_letters.list()) == old["dead"]
    assert not (root / "archive").exists()

    result = _exporter(spark, broker, root).run(cutoff=cutoff)
    assert len(result.discarded) == 1
    assert sorted(_parquet_ids(spark, root, "archive")) == sorted(
        set(_parquet_ids(spark, root, "archive"))
    )
    assert len(_parquet_ids(spark, root, "archive")) == old["archive"]
    assert len(broker.archive(limit=1000)) == 5


def test_a_run_dying_after_the_delete_is_finished_by_the_next(
    spark: Any, history: tuple[sqlbroker.Broker, dict[str, int]], tmp_path: Path
) -> None:
    broker, old = history
    root = tmp_path / "export"
    cutoff = broker.backend.now() - timedelta(days=1)

    def die_before_publishing(step: str) -> None:
        if step.startswith("publishing"):
            raise Died(step)

    with pytest.raises(Died):
        _exporter(spark, broker, root, step=die_before_publishing).run(cutoff=cutoff)
    assert len(broker.archive(limit=1000)) == 5

    result = _exporter(spark, broker, root).run(cutoff=cutoff)
    assert len(result.recovered) == 1
    assert (result.archive_rows, result.dead_rows) == (0, 0)
    assert len(_parquet_ids(spark, root, "archive")) == old["archive"]
    assert len(_parquet_ids(spark, root, "dead")) == old["dead"]


def test_a_database_that_changed_under_the_export_is_not_deleted_from(
    spark: Any, history: tuple[sqlbroker.Broker, dict[str, int]], tmp_path: Path
) -> None:
    broker, old = history
    root = tmp_path / "export"
    cutoff = broker.backend.now() - timedelta(days=1)

    def purge_while_verifying(step: str) -> None:
        if step.startswith("verifying"):
            broker.dead_letters.purge(topic="mail.sent")

    with pytest.raises(ExportMismatch, match="nothing was deleted"):
        _exporter(spark, broker, root, step=purge_while_verifying).run(cutoff=cutoff)
    assert len(broker.archive(limit=1000)) == old["archive"] + 5
    assert len(broker.dead_letters.list()) == old["dead"] - 2
    assert not (root / "_staging").exists()


def test_files_that_differ_from_what_the_export_read_are_not_deleted_from(
    spark: Any, history: tuple[sqlbroker.Broker, dict[str, int]], tmp_path: Path
) -> None:
    """Issue 28 item 6: the export reads the database once; the written files are read back
    in full and checked against what that read saw (a hash of every row), not only against
    the database's counts and ids. A staged file whose payload changed, every count and id
    intact, deletes nothing and leaves no staging directory; the next run exports it all."""
    import pyarrow.parquet as pq

    broker, old = history
    root = tmp_path / "export"
    cutoff = broker.backend.now() - timedelta(days=1)

    def tamper_while_verifying(step: str) -> None:
        if step.startswith("verifying"):
            path = sorted((root / "_staging").rglob("archive/**/*.parquet"))[0]
            table = pq.read_table(path)
            payloads = [b"tampered", *table.column("payload").to_pylist()[1:]]
            index = table.schema.get_field_index("payload")
            table = table.set_column(index, "payload", pa.array(payloads, pa.binary()))
            pq.write_table(table, path, use_deprecated_int96_timestamps=True)
            path.with_name(f".{path.name}.crc").unlink(missing_ok=True)

    with pytest.raises(ExportMismatch, match=r"files and read differ.*nothing was deleted"):
        _exporter(spark, broker, root, step=tamper_while_verifying).run(cutoff=cutoff)
    assert len(broker.archive(limit=1000)) == old["archive"] + 5
    assert len(broker.dead_letters.list()) == old["dead"]
    assert not (root / "_staging").exists()

    result = _exporter(spark, broker, root).run(cutoff=cutoff)
    assert (result.archive_rows, result.dead_rows, result.deleted) == (old["archive"], 8, True)
    assert sorted(_parquet_ids(spark, root, "archive")) == sorted(
        set(_parquet_ids(spark, root, "archive"))
    )
    assert len(_parquet_ids(spark, root, "archive")) == old["archive"]
    assert not (root / "_staging").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_cli_exports_and_reports(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    with sqlbroker.Broker(url) as broker:
        broker.subscribe("billing", "orders.#")
        broker.publish_many([{"topic": "orders.created", "payload": {"n": n}} for n in range(10)])
        broker.complete(broker.claim("billing", limit=10))
    root, folder = tmp_path / "export", tmp_path / "report"
    command = [str(Path(sys.executable).with_name("sqlbroker")), "--url", url, "pipeline"]
    done = subprocess.run(
        [*command, "export", "--out", str(root), "--older-than", "0s", "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["export"]["archive_rows"] == 10
    done = subprocess.run(
        [*command, "report", "--from", str(root), "--out", str(folder), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "report.html" in done.stdout
    assert (folder / "report.html").read_text().count("<svg") >= 3
    bad = subprocess.run(
        [*command, "export", "--out", str(root), "--older-than", "soon"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
