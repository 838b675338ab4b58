"""``sqlbroker subscriptions retention``: show and set a subscription's retention; the
times also show in ``subscriptions`` and ``stats``."""

from __future__ import annotations

from pathlib import Path

from tests.test_cli import assert_clean_error, json_of, ok, run, stats_row

import sqlbroker


def test_show_and_set_retention(backend_url: str) -> None:
    ok(backend_url, "subscribe", "orders", "orders.*")
    assert json_of(backend_url, "subscriptions", "retention") == [
        {
            "subscription": "orders",
            "archive": 7 * 86400.0,
            "dead": 30 * 86400.0,
            "archive_default": True,
            "dead_default": True,
        }
    ]
    shown = ok(
        backend_url, "subscriptions", "retention", "orders", "--archive", "3d", "--dead", "12h"
    )
    assert "3.0d" in shown.stdout
    assert "12.0h" in shown.stdout
    with sqlbroker.Broker(backend_url) as broker:
        (kept,) = broker.retention("orders")
    assert (kept.archive, kept.dead, kept.archive_default) == (3 * 86400.0, 43200.0, False)
    assert stats_row(backend_url, "orders")["archive_retention"] == 3 * 86400.0
    assert "archive kept" in ok(backend_url, "subscriptions").stdout

    ok(backend_url, "subscriptions", "retention", "orders", "--default", "--dead", "60d")
    (row,) = json_of(backend_url, "subscriptions", "retention", "orders")
    assert (row["archive_default"], row["dead"]) == (True, 60 * 86400.0)


def test_bad_retention_is_one_line_and_writes_nothing(backend_url: str) -> None:
    ok(backend_url, "subscribe", "orders", "orders.*")
    for args, code, text in (
        (["orders", "--archive", "0"], 2, "archive"),
        (["orders", "--dead", "soon"], 2, "duration"),
        (["--archive", "1d"], 2, "NAME"),
        (["nope", "--archive", "1d"], 1, "no subscription named 'nope'"),
    ):
        result = run(backend_url, "subscriptions", "retention", *args)
        assert result.exit_code == code, result.output
        assert text in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    (row,) = json_of(backend_url, "subscriptions", "retention")
    assert (row["archive_default"], row["dead_default"]) == (True, True)


def test_setting_without_a_name_is_a_usage_error(tmp_path: Path) -> None:
    """retention and flow refuse a missing NAME alike: one line pointing to --help."""
    url = f"sqlite:///{tmp_path}/cli.db"
    for args, what in (
        (["retention", "--archive", "1d"], "retention"),
        (["flow", "--rate", "5/s"], "flow limits"),
    ):
        result = run(url, "subscriptions", *args)
        assert_clean_error(result, 2, f"NAME whose {what} to set", "--help")
