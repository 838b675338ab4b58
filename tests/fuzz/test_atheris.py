"""The atheris harnesses as bounded CI tests: a fixed seed and run count each (≈ 10 s).

A crash fails the test with libFuzzer's report; the input is saved in the test's tmp
directory (``crash-…``) — turn it into a regression test. ``make fuzz`` runs the same
harnesses for as long as ``FUZZ_SECONDS`` says, keeping a corpus between runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris is in the dev extra")

HERE = Path(__file__).resolve().parent
RUNS = {"harness_serde.py": 12_000, "harness_topics.py": 40_000}


@pytest.mark.slow
@pytest.mark.parametrize("harness", sorted(RUNS))
def test_harness_finds_no_crash(harness: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / harness),
            f"-runs={RUNS[harness]}",
            "-seed=1",
            "-max_len=512",
            "-max_total_time=15",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    report = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"{harness} crashed:\n{report}"
    assert "Done" in report, report
