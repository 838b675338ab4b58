"""Celery on sqlbroker against Celery on Redis and against sqlbroker's own API, in one run
(issue 27, "Benchmarks").

Contenders, each repetition on a fresh, empty store, interleaved:

- ``celery+redis``: Celery's Redis transport on Debian's ``redis-server``, started here on a
  free loopback port with its defaults (no fsync per write: a crash of Redis can lose the
  last second of tasks);
- ``celery+sqlbroker/postgresql``: Celery on ``sqlbroker+postgresql://`` — a durable
  throwaway PostgreSQL (``fsync``, ``synchronous_commit`` on, as PostgreSQL ships);
- ``celery+sqlbroker/postgresql-async``: the same with the transport option
  ``broker_options={"synchronous_commit": "off"}``: commits do not wait for the WAL flush, so
  a crash of PostgreSQL (not of a worker) can lose the last ones — Redis's kind of durability;
- ``celery+sqlbroker/sqlite``: Celery on ``sqlbroker+sqlite:///`` (WAL, ``synchronous=FULL``);
- ``sqlbroker/postgresql``: the same no-op handler as a ``@broker.subscriber`` run by
  ``sqlbroker worker``, published with ``Broker.send`` one by one.

Each repetition publishes ``--tasks`` no-op tasks one call at a time (``task.delay()`` or
``broker.send()``) from ``--publishers`` threads (default 8, as a web application's request
threads would) of one process — the publish rate — then starts one worker process
with two slots (``celery worker -c 2``, prefork, ``acks_late``; ``sqlbroker worker
--concurrency 2``) and measures the drain: tasks over the time from the first task's start
to the last one's end, read from the timestamps the tasks append to a file. Startup is not
counted. Medians of ``--repeats``; the ratios divide by Celery on Redis.

    .venv/bin/python bench/adapters_celery.py [--tasks 3000] [--repeats 3]

Needs the ``celery`` extra, the ``redis`` client (``pip install redis``) and
``redis-server`` (``apt-get install redis-server``). Writes
``bench/results/adapters_celery.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
REDIS_SERVER = "/usr/bin/redis-server"

CELERY_APP = """\
import json
import os
import time

import sqlbroker.contrib.celery  # the sqlbroker+… broker URLs
from celery import Celery

app = Celery("bench", broker=os.environ["BENCH_BROKER"])
app.conf.task_acks_late = True
app.conf.worker_hijack_root_logger = False
app.conf.broker_transport_options = json.loads(os.environ["BENCH_TRANSPORT_OPTIONS"])
_log = None


@app.task(name="bench.noop", ignore_result=True)
def noop(n):
    global _log
    if _log is None:
        _log = os.open(os.environ["BENCH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    started = time.time()
    os.write(_log, f"{started} {time.time()}\\n".encode())
"""

SQLBROKER_APP = """\
import os
import time

from sqlbroker import Broker

broker = Broker(os.environ["BENCH_BROKER"])
_log = os.open(os.environ["BENCH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)


@broker.subscriber(queue="bench", concurrency=2)
def noop(msg):
    started = time.time()
    os.write(_log, f"{started} {time.time()}\\n".encode())
"""


@dataclass
class Sample:
    publish_rate: float
    drain_rate: float
    other_cpu_pct: float = 0.0
    """CPU the rest of the machine used meanwhile, as a share of all cores."""


@dataclass
class Contender:
    name: str
    store: Callable[[Path], contextlib.AbstractContextManager[str]]
    """Yields the broker URL of a fresh, empty store."""
    celery: bool
    transport_options: dict[str, object] = field(default_factory=dict)


# --- stores ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Redis:
    """A ``redis-server`` of our own on a loopback port; flushed before each repetition."""

    def __init__(self, directory: Path) -> None:
        if not Path(REDIS_SERVER).exists():
            sys.exit("redis-server is missing: apt-get install redis-server")
        try:
            import redis
        except ImportError:
            sys.exit("the redis client is missing: pip install redis")
        self.port = _free_port()
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        harness.OWN_ROOTS.append(self.process.pid)
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.version = str(self.client.info()["redis_version"])

    @contextlib.contextmanager
    def fresh(self, directory: Path) -> Iterator[str]:
        self.client.flushall()
        yield f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


class Postgres:
    def __init__(self) -> None:
        self.server = harness.start_postgres()
        self.count = 0

    @contextlib.contextmanager
    def fresh(self, directory: Path) -> Iterator[str]:
        self.count += 1
        name = f"celery_bench_{self.count}"
        self.server.create_database(name)
        url = self.server.url(name)
        from sqlbroker import Broker

        with Broker(url) as broker:
            broker.migrate()
        try:
            yield url
        finally:
            self.server.drop_database(name, missing_ok=True)


@contextlib.contextmanager
def fresh_sqlite(directory: Path) -> Iterator[str]:
    path = directory / "bench.db"
    for leftover in directory.glob("bench.db*"):
        leftover.unlink()
    yield f"sqlite:///{path}"


# --- one repetition ----------------------------------------------------------------------------


def _env(directory: Path, url: str, log: Path, options: dict[str, object]) -> dict[str, str]:
    return {
        **os.environ,
        "BENCH_TRANSPORT_OPTIONS": json.dumps(options),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(directory)]),
        "BENCH_BROKER": url,
        "BENCH_LOG": str(log),
    }


def _publish(contender: Contender, tasks: int, threads: int, env: dict[str, str]) -> float:
    """Publish in a process of its own, one call per task from ``threads`` threads; return
    tasks per second."""
    if contender.celery:
        setup = "from bench_celery import noop\none = noop.delay\n"
    else:
        setup = (
            "import os\nfrom sqlbroker import Broker\n"
            "broker = Broker(os.environ['BENCH_BROKER'])\n"
            "one = lambda n: broker.send('bench', n)\n"
        )
    code = (
        f"import time\nfrom concurrent.futures import ThreadPoolExecutor\n{setup}"
        f"pool = ThreadPoolExecutor({threads})\n"
        f"list(pool.map(one, range(-{threads}, 0)))\n"  # connect and declare first
        f"start = time.perf_counter()\nlist(pool.map(one, range({tasks - threads})))\n"
        "print(time.perf_counter() - start)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=env["PYTHONPATH"].split(os.pathsep)[1],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{contender.name}: publishing failed:\n{done.stderr}")
    return (tasks - threads) / float(done.stdout.split()[-1])


def _worker(contender: Contender, directory: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    if contender.celery:
        command = [
            *(sys.executable, "-m", "celery", "-A", "bench_celery", "worker"),
            *("-c", "2", "-P", "prefork", "-l", "WARNING"),
            *("--without-mingle", "--without-gossip", "--without-heartbeat"),
        ]
    else:
        command = [
            str(Path(sys.executable).with_name("sqlbroker")),
            *("worker", "bench_sqlbroker:broker", "--log-level", "warning"),
        ]
    with (directory / "worker.log").open("ab") as out:
        return subprocess.Popen(
            command, cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def _lines(log: Path) -> list[tuple[float, float]]:
    if not log.exists():
        return []
    pairs = []
    for line in log.read_text().splitlines():
        start, end = line.split()
        pairs.append((float(start), float(end)))
    return pairs


def run_once(contender: Contender, directory: Path, tasks: int, threads: int) -> Sample:
    log = directory / "tasks.log"
    log.unlink(missing_ok=True)
    with contender.store(directory) as url:
        broker_url = (
            f"sqlbroker+{url}" if contender.celery and "sqlbroker" in contender.name else url
        )
        env = _env(directory, broker_url, log, contender.transport_options)
        publish_rate = _publish(contender, tasks, threads, env)
        worker = _worker(contender, directory, env)
        try:
            deadline = time.monotonic() + 600
            while len(_lines(log)) < tasks:
                if worker.poll() is not None:
                    raise RuntimeError(f"{contender.name}: the worker exited; see worker.log")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{contender.name}: gave up after 600 s")
                time.sleep(0.05)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        pairs = _lines(log)
        first = min(start for start, _ in pairs)
        last = max(end for _, end in pairs)
        return Sample(publish_rate, len(pairs) / (last - first))


# --- the run -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--publishers", type=int, default=8, help="publishing threads")
    parser.add_argument(
        "--max-noise", type=float, default=25.0, help="%% CPU of others that repeats a sample"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--from-json", type=Path, help="write the report again from a run's JSON, run nothing"
    )
    args = parser.parse_args()
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        args.tasks = saved["tasks"]
        args.repeats = saved.get("repeats", args.repeats)
        args.publishers = saved.get("publishers", args.publishers)
        runs = {name: [Sample(**s) for s in got] for name, got in saved["samples"].items()}
        report(runs, args, saved["machine"]["redis"], saved["machine"])
        return

    work = Path(tempfile.mkdtemp(prefix="sqlbroker-celery-bench-"))
    (work / "bench_celery.py").write_text(CELERY_APP)
    (work / "bench_sqlbroker.py").write_text(SQLBROKER_APP)
    redis = Redis(work)
    postgres = Postgres()
    contenders = [
        Contender("celery+redis", redis.fresh, celery=True),
        Contender("celery+sqlbroker/postgresql", postgres.fresh, celery=True),
        Contender(
            "celery+sqlbroker/postgresql-async",
            postgres.fresh,
            celery=True,
            transport_options={"broker_options": {"synchronous_commit": "off"}},
        ),
        Contender("celery+sqlbroker/sqlite", fresh_sqlite, celery=True),
        Contender("sqlbroker/postgresql", postgres.fresh, celery=False),
    ]
    samples: dict[str, list[Sample]] = {c.name: [] for c in contenders}
    try:
        for repeat in range(args.repeats):
            for contender in contenders:
                for _ in range(3):  # a sample others disturbed is measured again, twice at most
                    with harness.NoiseMeter() as noise:
                        sample = run_once(contender, work, args.tasks, args.publishers)
                    sample.other_cpu_pct = noise.other_cpu_pct
                    if sample.other_cpu_pct <= args.max_noise:
                        break
                samples[contender.name].append(sample)
                print(
                    f"[{repeat + 1}/{args.repeats}] {contender.name}: publish"
                    f" {sample.publish_rate:,.0f}/s, drain {sample.drain_rate:,.0f}/s"
                    f" (others used {sample.other_cpu_pct:.0f} % of the CPU)",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        redis.stop()
        postgres.server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(samples, args, redis.version)


def report(
    samples: dict[str, list[Sample]],
    args: argparse.Namespace,
    redis_version: str,
    machine: dict[str, object] | None = None,
) -> None:
    import celery
    import kombu

    median = {
        name: (
            statistics.median(s.publish_rate for s in runs),
            statistics.median(s.drain_rate for s in runs),
            statistics.median(1 / (1 / s.publish_rate + 1 / s.drain_rate) for s in runs),
        )
        for name, runs in samples.items()
    }
    base_publish, base_drain, base_both = median["celery+redis"]
    machine = machine or {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis": redis_version,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
    }
    lines = [
        "# Celery on sqlbroker vs Celery on Redis vs sqlbroker's own API",
        "",
        f"`bench/adapters_celery.py --tasks {args.tasks} --repeats {args.repeats}"
        f" --publishers {args.publishers}`, "
        f"{machine['date']}, commit {machine['commit']}: Python {machine['python']}, "
        f"{machine['cpus']} CPUs (shared), Celery {machine['celery']}, Kombu "
        f"{machine['kombu']}, Redis {redis_version}.",
        "",
        f"No-op tasks; publish = one `delay()`/`send()` call per task from {args.publishers}"
        " threads of one process; drain ="
        " one worker process with 2 slots (Celery: prefork `-c 2`, `acks_late`), first task"
        " start to last task end; publish then drain = the tasks over both times added"
        " (each sample's). Medians; ratios to Celery on Redis.",
        "",
        "| contender | publish tasks/s | × Redis | drain tasks/s | × Redis"
        " | publish then drain | × Redis | others' CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (publish, drain, both) in median.items():
        noise = statistics.median(s.other_cpu_pct for s in samples[name])
        lines.append(
            f"| {name} | {publish:,.0f} | {publish / base_publish:.2f} | {drain:,.0f} |"
            f" {drain / base_drain:.2f} | {both:,.0f} | {both / base_both:.2f} | {noise:.0f} % |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "adapters_celery.md").write_text(text)
    (args.out / "adapters_celery.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "tasks": args.tasks,
                "repeats": args.repeats,
                "publishers": args.publishers,
                "samples": {name: [vars(s) for s in runs] for name, runs in samples.items()},
                "median": {
                    name: {"publish": p, "drain": d, "publish_then_drain": b}
                    for name, (p, d, b) in median.items()
                },
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
