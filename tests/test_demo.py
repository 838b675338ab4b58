"""``make demo`` (examples/demo.py) runs end to end, its numbers add up, and the commands it
prints to inspect the results work."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import sqlbroker

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
POISON_REASONS = {
    "invalid address": 3,
    "non-retryable error: ValueError": 2,
    "max attempts exhausted (4 of 4): ConnectionError": 1,
}


def run_demo(cwd: Path, *args: str, db: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLBROKER_")}
    env.update({"NO_COLOR": "1", "COLUMNS": "120"})
    if db is not None:
        env["SQLBROKER_DEMO_DB"] = str(db)
    result = subprocess.run(
        [sys.executable, str(DEMO), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def summary_of(stdout: str) -> dict[str, float]:
    """The machine-readable last line: ``demo: orders=… copies=… completed=… …``."""
    (line,) = [line for line in stdout.splitlines() if line.startswith("demo: ")]
    assert line == stdout.strip().splitlines()[-1]
    return {name: float(value) for name, value in (item.split("=") for item in line.split()[1:])}


def check_numbers(numbers: dict[str, float], db: Path) -> None:
    assert numbers["orders"] >= 2000
    assert numbers["copies"] > numbers["orders"]  # fanned out
    assert (
        numbers["completed"] + numbers["dead"] + numbers["expired"] + numbers["pending"]
        == numbers["copies"]
    )
    assert numbers["pending"] == 0
    assert numbers["retried"] > 0
    assert numbers["expired"] > 0
    assert numbers["unrouted"] > 0
    assert numbers["dead"] == sum(POISON_REASONS.values())
    assert numbers["seconds"] < 60

    with sqlbroker.Broker(f"sqlite:///{db}") as broker:
        dead = broker.dead_letters.list(limit=1000)
        reasons: dict[str, int] = {}
        for letter in dead:
            assert letter.subscription == "fulfilment"
            reasons[letter.reason] = reasons.get(letter.reason, 0) + 1
        assert reasons == POISON_REASONS
        expired = broker.archive(outcome="expired", limit=10_000)
        assert len(expired) == numbers["expired"]
        completed = broker.archive(outcome="completed", limit=10_000)
        assert len(completed) == numbers["completed"]
        assert sum(copy.attempts > 1 for copy in completed) == numbers["retried"]
        assert all(s.ready + s.scheduled + s.running == 0 for s in broker.stats())


def test_demo_runs_and_its_numbers_add_up(tmp_path: Path) -> None:
    db = tmp_path / "state" / "demo.db"
    result = run_demo(tmp_path, db=db)
    numbers = summary_of(result.stdout)
    check_numbers(numbers, db)

    text = result.stdout
    for heading in ("subscription", "What happened", "invalid address", "expired"):
        assert heading in text
    # The dead-letter commands it prints are the real thing: run `dlq list` as printed.
    (list_command,) = [line.strip() for line in text.splitlines() if line.endswith(" dlq list")]
    assert list_command.split()[1:4] == ["--url", "sqlite:///state/demo.db", "dlq"]
    listed = subprocess.run(
        [*shlex.split(list_command), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == numbers["dead"]
    assert any(line.strip().endswith("dlq replay --all --yes") for line in text.splitlines())


@pytest.mark.slow
def test_demo_runs_twice_in_a_row(tmp_path: Path) -> None:
    """Each run starts from a fresh database, so a second run reports one run's worth."""
    db = tmp_path / "demo.db"
    first = summary_of(run_demo(tmp_path, "--db", str(db)).stdout)
    second = summary_of(run_demo(tmp_path, "--db", str(db)).stdout)
    assert first["copies"] == second["copies"]
    check_numbers(second, db)
