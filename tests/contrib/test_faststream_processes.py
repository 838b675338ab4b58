"""A FastStream application on sqlbroker in real processes (``faststream run``): it
consumes and publishes, dead-letters a payload its handler's signature refuses, stops
cleanly on SIGTERM, and a SIGKILLed process's message is redelivered by another process
once its lease expires — nothing lost. Both backends."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sqlbroker
from runtime.support import wait_until

pytest.importorskip("faststream")

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"


class AppProcess:
    """``faststream run fsapp:app`` with its output in a log file."""

    def __init__(self, url: str, effects: Path, log: Path, *, lease: float) -> None:
        env = {
            **os.environ,
            "FSAPP_URL": url,
            "FSAPP_EFFECTS": str(effects),
            "FSAPP_LEASE": str(lease),
            "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)]),
        }
        self.log_path = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "faststream", "run", "fsapp:app"],
                env=env,
                cwd=HERE,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.log()}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


def effects_of(path: Path, event: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if row["event"] == event]


@pytest.fixture
def spawn(tmp_path: Path, backend_url: str) -> Any:
    started: list[AppProcess] = []

    def make(lease: float = 30.0) -> AppProcess:
        process = AppProcess(
            backend_url,
            tmp_path / "effects.jsonl",
            tmp_path / f"app{len(started)}.log",
            lease=lease,
        )
        started.append(process)
        return process

    yield make
    for process in started:
        process.stop()


def completed(broker: sqlbroker.Broker, subscription: str) -> dict[str, sqlbroker.ArchivedMessage]:
    rows = broker.archive(subscription, outcome="completed", limit=1000)
    return {row.message_id: row for row in rows}


def test_faststream_run_consumes_publishes_and_dead_letters_a_bad_payload(
    broker: sqlbroker.Broker, spawn: Any, tmp_path: Path
) -> None:
    # Published with sqlbroker's own API before the app runs: the queue exists already.
    good = [broker.send("orders", {"id": f"o{n}", "qty": n}) for n in range(8)]
    bad = broker.send("orders", {"id": "bad", "qty": "many"})
    app = spawn()
    effects = tmp_path / "effects.jsonl"

    def settled() -> bool:
        if app.process.poll() is not None:
            raise AssertionError(f"the app exited:\n{app.log()}")
        # The completes are written back after the handlers ran (batched): an audit's
        # effect, or the audit itself, may come before them.
        return (
            len(effects_of(effects, "audit")) >= len(good)
            and len(completed(broker, "orders")) >= len(good)
            and len(completed(broker, "audit")) >= len(good)
            and bool(broker.dead_letters.list(subscription="orders"))
        )

    wait_until(settled, timeout=60, what="the app to handle every order")
    assert set(completed(broker, "orders")) == set(good)
    assert sorted(e["id"] for e in effects_of(effects, "audit")) == sorted(
        f"o{n}" for n in range(8)
    )
    # The handler's return value went through @broker.publisher to the audit group.
    assert len(completed(broker, "audit")) == len(good)
    [dead] = broker.dead_letters.list(subscription="orders")
    assert dead.message_id == bad
    assert dead.attempts == 1
    assert dead.reason.startswith("invalid payload")
    assert "qty" in dead.reason
    assert "ValidationError" in (dead.error_type or "")

    app.process.send_signal(signal.SIGTERM)
    assert app.wait(timeout=30) == 0, app.log()


def test_a_sigkilled_app_s_message_is_redelivered_by_another_app_and_nothing_is_lost(
    broker: sqlbroker.Broker, spawn: Any, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.jsonl"
    stuck = broker.send("orders", {"id": "stuck", "qty": 1, "hang": 120})
    others = [broker.send("orders", {"id": f"m{n}", "qty": n}) for n in range(10)]
    first = spawn(lease=1.5)
    wait_until(
        lambda: any(e["id"] == "stuck" for e in effects_of(effects, "start")),
        timeout=60,
        what="the stuck handler to start",
    )
    first.process.send_signal(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL

    second = spawn(lease=1.5)
    wait_until(
        lambda: len(completed(broker, "orders")) == 1 + len(others),
        timeout=60,
        what=f"every order completed:\n{second.log()}",
    )
    rows = completed(broker, "orders")
    assert set(rows) == {stuck, *others}
    assert rows[stuck].attempts >= 2
    starts = [e for e in effects_of(effects, "start") if e["id"] == "stuck"]
    assert [e["pid"] for e in starts] == [first.pid, second.pid]
    assert [e["attempt"] for e in starts] == [1, 2]
    assert not broker.dead_letters.list(subscription="orders")
    # Each order's result reached the audit group (a duplicate only for a stated reason:
    # the killed process may have published a result it had not yet acknowledged).
    wait_until(
        lambda: (
            {e["id"] for e in effects_of(effects, "audit")}
            >= {"stuck", *(f"m{n}" for n in range(10))}
        ),
        timeout=30,
        what="every result audited",
    )
    finishes = collections.Counter((e["id"], e["pid"]) for e in effects_of(effects, "finish"))
    assert all(count == 1 for count in finishes.values()), finishes
    second.process.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0, second.log()


def test_faststream_docs_gen_writes_the_asyncapi_channels(tmp_path: Path) -> None:
    out = tmp_path / "asyncapi.json"
    env = {
        **os.environ,
        "FSAPP_URL": "postgresql://app:secret@db.example/shop",
        "FSAPP_EFFECTS": str(tmp_path / "effects.jsonl"),
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "faststream", "docs", "gen", "fsapp:app", "--out", str(out)],
        env=env,
        cwd=HERE,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())
    assert {c["address"] for c in document["channels"].values()} == {"orders", "orders.done"}
    assert "secret" not in out.read_text()
    assert "qty" in json.dumps(document["components"])  # the Order model
