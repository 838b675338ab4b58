"""bench/issue23_costs.py still runs against the tree: it switches two checks off by
name (the claim's take-back of expired leases, the caller connection's same-database
check), so a rename must not leave it pointing at nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.postgres
@pytest.mark.slow
def test_issue23_costs_runs() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    script = ROOT / "bench" / "issue23_costs.py"
    done = subprocess.run(
        [sys.executable, str(script), "--pairs", "1", "--messages", "5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "claim+complete limit=  1",
        "claim+complete limit= 10",
        "claim+complete limit=100",
        "one take-back sweep, nothing expired",
        "publish(conn=) in the caller's transaction",
    ], done.stdout
