"""How durable a claim's commit is (SQLite): the same contract as on PostgreSQL.

By default a claim's transaction commits at ``synchronous = NORMAL`` even when the
broker's level is FULL: the commit does not fsync the WAL. A killed process loses nothing
(its WAL frames are written); only a crash of the machine can forget the lease, until
the next FULL commit (an ack, a publish) syncs the WAL up to and past the claim.
``durable_claims=True`` makes the claim fsync like every other write. The lower level
must never outlive the claim's transaction.

The fsyncs are counted for real: the claims run in a child process under ``strace``.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sqlbroker
from sqlbroker.core.errors import DatabaseBusy

CLAIMS = 40

CHILD = textwrap.dedent(
    """
    import os, sys
    import sqlbroker

    url, durable = sys.argv[1], sys.argv[2] == "durable"

    def mark(text):
        os.write(2, f"@@{text}\\n".encode())

    with sqlbroker.Broker(url, pool_size=1, durable_claims=durable) as broker:
        broker.send_many("q", [{"i": i} for i in range(CLAIMS)])
        mark("claims")
        for _ in range(CLAIMS):
            assert len(broker.claim("q", limit=1)) == 1
        mark("publishes")
        for i in range(CLAIMS):
            broker.send("other", {"i": i})
        mark("end")
    """
).replace("CLAIMS", str(CLAIMS))


def fsyncs_per_phase(tmp_path: Path, mode: str) -> dict[str, int]:
    """Run the child under strace; count fsync/fdatasync calls between its marks."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    url = f"sqlite:///{tmp_path}/claims.db"
    sqlbroker.Broker(url, migrate=True).close()
    log = tmp_path / "strace.log"
    traced = [strace, "-f", "-o", str(log), "-e", "trace=fsync,fdatasync,write"]
    done = subprocess.run(
        [*traced, sys.executable, "-c", CHILD, url, mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "ptrace" in done.stderr.lower():
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    counts: dict[str, int] = {}
    phase = "setup"
    for line in log.read_text().splitlines():
        if '"@@' in line:
            phase = line.split('"@@', 1)[1].split("\\n", 1)[0]
        elif "fsync(" in line or "fdatasync(" in line:
            counts[phase] = counts.get(phase, 0) + 1
    return counts


def test_a_claim_does_not_fsync_by_default_and_a_publish_after_it_does(tmp_path: Path) -> None:
    counts = fsyncs_per_phase(tmp_path, "default")
    assert counts.get("claims", 0) <= 2, f"{counts} fsyncs ({CLAIMS} claims)"
    assert counts.get("publishes", 0) >= CLAIMS, f"{counts} fsyncs ({CLAIMS} publishes)"


def test_durable_claims_fsync(tmp_path: Path) -> None:
    counts = fsyncs_per_phase(tmp_path, "durable")
    assert counts.get("claims", 0) >= CLAIMS, f"{counts} fsyncs ({CLAIMS} claims)"


def synchronous_level(broker: sqlbroker.Broker) -> int:
    with broker.backend.begin() as conn_tx:
        conn = conn_tx.connection
        return int(conn.execute("PRAGMA synchronous").fetchone()[0])


def test_a_failed_claim_leaves_the_connection_at_full(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    with sqlbroker.Broker(f"sqlite:///{path}", pool_size=1, busy_timeout=0.2) as broker:
        broker.send("q", {"n": 1})
        assert synchronous_level(broker) == 2
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(DatabaseBusy):
                broker.claim("q")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert synchronous_level(broker) == 2
        assert len(broker.claim("q")) == 1
        assert synchronous_level(broker) == 2


@pytest.mark.parametrize("durable", [False, True], ids=["default", "durable_claims"])
def test_a_killed_process_keeps_its_claims(tmp_path: Path, durable: bool) -> None:
    """Only a crash of the machine can forget a claim: a SIGKILLed process cannot."""
    url = f"sqlite:///{tmp_path}/killed.db"
    with sqlbroker.Broker(url) as broker:
        broker.send_many("q", [{"i": i} for i in range(20)])
    child = textwrap.dedent(
        f"""
        import os, signal, sqlbroker
        broker = sqlbroker.Broker({url!r}, durable_claims={durable})
        for _ in range(20):
            assert len(broker.claim("q", limit=1, lease=300)) == 1
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    with sqlbroker.Broker(url) as broker:
        pending = broker.pending("q")
    assert len(pending) == 20
    assert {(m.state, m.attempts) for m in pending} == {("running", 1)}
