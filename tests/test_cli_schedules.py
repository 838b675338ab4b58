"""``sqlbroker schedules`` and ``sqlbroker scheduler`` on both backends (CliRunner in
process; the scheduler's signal handling with a real process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner, Result

import sqlbroker
from sqlbroker.interfaces.cli import cli

CLI = [sys.executable, "-c", "from sqlbroker.interfaces.cli import main; main()"]
_ENV: Mapping[str, str | None] = {"SQLBROKER_URL": None, "SQLBROKER_DEBUG": None, "NO_COLOR": "1"}


def run(url: str, *args: str) -> Result:
    return CliRunner(env=_ENV).invoke(cli, ["--url", url, *args])


def ok(url: str, *args: str) -> Result:
    result = run(url, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def test_schedules_lists_deletes_pauses_and_resumes(broker: sqlbroker.Broker) -> None:
    url = broker.url if "***" not in broker.url else ""
    assert url, "the test databases have no password"
    broker.migrate()  # the CLI's reads never create the database
    assert "no schedules yet" in ok(url, "schedules").stdout
    assert json.loads(ok(url, "schedules", "--json").stdout) == []
    nightly = broker.schedule(
        "nightly", "reports.nightly", {"r": 1}, cron="0 3 * * *", tz="Europe/Paris"
    )
    broker.schedule("beat", "beat", 1, every=90, missed="all")

    table = ok(url, "schedules").stdout
    for text in ("nightly", "reports.nightly", "cron 0 3 * * *", "Europe/Paris", "every 90s"):
        assert text in table
    assert nightly.next_run_at.strftime("%Y-%m-%d %H:%M:%SZ") in table

    rows = json.loads(ok(url, "schedules", "list", "--json").stdout)
    assert [row["name"] for row in rows] == ["beat", "nightly"]
    assert rows[1]["spec"] == "cron 0 3 * * *"
    assert rows[1]["missed"] == "latest"
    assert datetime.fromisoformat(rows[1]["next_run_at"]) == nightly.next_run_at
    assert rows[0]["every"] == 90
    assert rows[0]["paused"] is False

    assert "paused schedule nightly" in ok(url, "schedules", "pause", "nightly").stdout
    assert "paused" in ok(url, "schedules").stdout
    assert broker.schedules(["nightly"])[0].paused
    resumed = ok(url, "schedules", "resume", "nightly").stdout
    assert "resumed schedule nightly; next run" in resumed
    assert not broker.schedules(["nightly"])[0].paused

    assert "deleted schedule beat" in ok(url, "schedules", "delete", "beat").stdout
    assert [s.name for s in broker.schedules()] == ["nightly"]
    for command in ("delete", "pause", "resume"):
        missing = run(url, "schedules", command, "beat")
        assert missing.exit_code == 1
        assert "no schedule named 'beat'" in missing.stderr
    bad = run(url, "schedules", "delete", "bad name")
    assert bad.exit_code == 2
    assert "name" in bad.stderr


def test_scheduler_once_publishes_the_due_ticks(broker: sqlbroker.Broker) -> None:
    broker.subscribe("seen", ["#"])
    broker.schedule("soon", "t.soon", 0, every=3600, start_at=datetime(2000, 1, 1, tzinfo=UTC))
    # Not due yet: the next tick of a start in the past is still ahead.
    assert "published 0 tick message(s)" in ok(broker.url, "scheduler", "--once").stdout
    # --log-level takes any case, as the worker's does (one option for both).
    ok(broker.url, "scheduler", "--once", "--log-level", "INFO")
    broker.schedule("due", "t.due", 0, every=0.01)
    time.sleep(0.05)  # real time: the CLI runs on the database clock
    out = ok(broker.url, "scheduler", "--once").stdout
    assert "published 1 tick message(s) for 1 schedule(s)" in out
    assert [d.topic for d in broker.claim("seen")] == ["t.due"]


def test_the_scheduler_process_stops_on_sigterm(broker: sqlbroker.Broker) -> None:
    broker.subscribe("seen", ["#"])
    broker.schedule("fast", "t.fast", 0, every=0.05, missed="all")
    env = {**os.environ, "SQLBROKER_URL": broker.url}
    process = subprocess.Popen(
        [*CLI, "scheduler"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not broker.pending("seen") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.pending("seen"), "the scheduler published nothing"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=20)
        assert process.stdout is not None
        process.stdout.close()


WORKER_APP = """
import sqlbroker

broker = sqlbroker.Broker({url!r})


@broker.subscriber(queue="jobs")
def handle(msg):
    pass
"""


def test_sqlbroker_worker_schedules_unless_told_not_to(
    broker: sqlbroker.Broker, tmp_path: Path
) -> None:
    (tmp_path / "sched_app.py").write_text(WORKER_APP.format(url=broker.url), encoding="utf-8")
    broker.subscribe("seen", ["#"])
    broker.schedule("beat", "t.beat", 0, every=0.05, missed="all")
    env = {k: v for k, v in os.environ.items() if k != "SQLBROKER_URL"}
    for flag in ("--no-schedules", "--schedules"):
        log_path = tmp_path / f"worker{flag}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*CLI, "worker", "sched_app:broker", flag],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 30
            while "running jobs" not in log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "running jobs" in log_path.read_text(), log_path.read_text()
            if flag == "--no-schedules":
                time.sleep(1.0)  # ticks fall due every 50 ms meanwhile; none may appear
                assert broker.pending("seen") == []
            else:
                while not broker.pending("seen") and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert broker.pending("seen"), log_path.read_text()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, log_path.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
