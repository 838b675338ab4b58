"""The peers' own environment and the bridge that runs their workloads in it.

pgqueuer, procrastinate, pgmq and huey are installed from the package index into
``bench/.peers-venv`` (created on first use, re-created when ``peers-requirements.txt``
changes), never into sqlbroker's ``.venv``: their dependency pins cannot move ours. Each
peer's workloads run in its own interpreter of that environment (``bench/peer_run.py``), which
answers with its :class:`harness.Sample` as one JSON line.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import harness
from harness import BENCH_DIR, REPO_DIR, BenchError, Database, Sample, Sizes

VENV = BENCH_DIR / ".peers-venv"
REQUIREMENTS = BENCH_DIR / "peers-requirements.txt"
STAMP = VENV / ".requirements.sha256"


def python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(log: Callable[[str], None]) -> dict[str, str]:
    """Create or refresh the peers' environment; return the installed peers' versions."""
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not (python().exists() and STAMP.exists() and STAMP.read_text() == wanted):
        log(f"installing the peers into {VENV.relative_to(REPO_DIR)} …")
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(python()), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
            check=True,
        )
        STAMP.write_text(wanted)
    script = (
        "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in"
        " ('pgqueuer', 'asyncpg', 'procrastinate', 'pgmq', 'huey', 'psycopg')}))"
    )
    out = subprocess.run([str(python()), "-c", script], check=True, capture_output=True)
    return dict(json.loads(out.stdout))


class PeerProcess:
    """One long-lived interpreter of the peers' venv serving one peer's workloads, one
    request at a time (``peer_run.py --serve``): the peer's imports (~1 s) are paid once
    instead of per repetition. Its CPU counts as the benchmark's own in the noise meter."""

    def __init__(self, system: str) -> None:
        self.system = system
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [str(python()), str(BENCH_DIR / "peer_run.py"), "--serve", system],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=REPO_DIR,
        )
        harness.OWN_ROOTS.append(self.process.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, workload: str, database: Database, sizes: Sizes) -> Sample:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        message = {"workload": workload, "database": asdict(database), "sizes": asdict(sizes)}
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            self._stderr.seek(0)
            tail = self._stderr.read()[-3000:]
            raise BenchError(f"{self.system} exited with {self.process.returncode}: {tail}")
        found = json.loads(line)
        if "error" in found:
            raise BenchError(found["error"])
        return Sample(found["metrics"], found["details"])

    def close(self) -> None:
        if self.alive():
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()


_PROCESSES: dict[str, PeerProcess] = {}


def close_all() -> None:
    while _PROCESSES:
        _PROCESSES.popitem()[1].close()


atexit.register(close_all)


def remote(system: str, workload: str) -> Callable[[Database, Sizes], Sample]:
    """A workload function that runs ``workload`` of peer ``system`` in the peers' venv."""

    def run(database: Database, sizes: Sizes) -> Sample:
        process = _PROCESSES.get(system)
        if process is None or not process.alive():
            if process is not None:
                process.close()
            process = _PROCESSES[system] = PeerProcess(system)
        return process.request(workload, database, sizes)

    return run
