"""A Spark standalone cluster for the tests: a master and two workers, each a JVM of its own
started with ``bin/spark-class`` from the installed PySpark package, on loopback.

The workers run with a scrubbed environment (no ``PYTHONPATH``, no ``SQLBROKER_*``) in
directories of their own, and their executors run in per-application directories below
those: a job submitted to the cluster gets everything it needs through Spark's options
(``spark.pyspark.python``, ``spark.executorEnv.*``), never through the state of the driver's
process. Jobs are submitted with ``bin/spark-submit --master spark://127.0.0.1:PORT``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

import sqlbroker

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SOURCE = Path(sqlbroker.__file__).resolve().parents[1]
"""The directory sqlbroker is imported from here: executors import it from there too."""

_SCRUBBED = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _SCRUBBED and not name.startswith(("SQLBROKER_", "PG"))
    }
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(home / "logs"),
        SPARK_PID_DIR=str(home),
        SPARK_DAEMON_MEMORY="256m",
        SPARK_NO_DAEMONIZE="1",
    )
    env.update(extra)
    return env


class StandaloneCluster:
    """``start()`` a master and ``workers`` workers; ``stop()`` them (SIGTERM, then SIGKILL).

    ``worker_environment`` is the whole of what the workers (and so their executors) get
    of an environment beyond the machine's: it stands for the settings of other hosts."""

    def __init__(
        self,
        home: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        worker_environment: dict[str, str] | None = None,
    ) -> None:
        self.home = home
        self.worker_environment = worker_environment or {}
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = _free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._processes: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, arguments: list[str], cwd: Path) -> Path:
        cwd.mkdir(parents=True, exist_ok=True)
        log = self.home / f"{name}.log"
        with log.open("wb") as output:
            self._processes.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), *arguments],
                    cwd=cwd,
                    env=_environment(self.home, self.worker_environment),
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        return log

    def _wait_for(self, log: Path, pattern: str, count: int = 1, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(re.findall(pattern, log.read_text(errors="replace"))) < count:
            if any(p.poll() is not None for p in self._processes):
                raise RuntimeError(f"a cluster JVM exited; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not start in {timeout:g} s; see {log}")
            time.sleep(0.2)

    def start(self) -> StandaloneCluster:
        self.home.mkdir(parents=True, exist_ok=True)
        master_log = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(_free_port()),
            ],
            self.home / "master",
        )
        try:
            self._wait_for(master_log, r"I have been elected leader")
            for number in range(self.workers):
                folder = self.home / f"worker-{number}"
                self._spawn(
                    f"worker-{number}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        self.master_url,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--webui-port",
                        str(_free_port()),
                        "--work-dir",
                        str(folder / "work"),
                    ],
                    folder,
                )
            self._wait_for(master_log, r"Registering worker", count=self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in self._processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()

    def submit_command(self, *arguments: str) -> list[str]:
        """``spark-submit`` of a program to this cluster, its Python workers running this
        interpreter with sqlbroker importable from :data:`SOURCE` (Spark options only)."""
        return [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            self.master_url,
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.memory=512m",
            "--conf",
            "spark.executor.memory=512m",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            # A Python worker must connect back within this (default 15 s): on a loaded
            # test machine its start alone has taken longer.
            "--conf",
            "spark.python.authenticate.socketTimeout=120s",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            "--conf",
            f"spark.pyspark.driver.python={sys.executable}",
            "--conf",
            f"spark.executorEnv.PYTHONPATH={SOURCE}",
            *arguments,
        ]

    def submit_environment(self) -> dict[str, str]:
        """The environment of a driver process: the caller's, plus sqlbroker on its path."""
        env = dict(os.environ)
        env["SPARK_HOME"] = str(SPARK_HOME)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE), env.get("PYTHONPATH")]))
        for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS"):
            env.pop(name, None)
        return env
