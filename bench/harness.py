"""The benchmark harness: sizes, databases, repeated measurements and machine facts.

A *system* (sqlbroker, the raw-SQL floor, later pgqueuer / procrastinate / pgmq) offers
workload functions. A *target* hands out a fresh, empty database for every repetition. The
harness runs each (system, target, workload) case ``repeats`` times, round-robin so that
slow drift of a noisy machine spreads over all cases instead of biasing one, and summarizes
each metric as median, min and max.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
QUEUE = "bench"


# --- sizes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does. Sized for a 2-core box."""

    mode: str
    repeats: int
    publish_single: int
    """Messages published one per transaction."""
    publish_batch: int
    """Messages published in batches of ``batch_size``."""
    batch_size: int
    drain: int
    """Messages pre-published, then consumed by each drain workload."""
    drain_threads: int
    """Threads of the low-level claim/complete loop."""
    worker_concurrency: int
    """Concurrency of the runtime's worker process."""
    latency_rate: float
    """Messages per second published into an idle worker."""
    latency_seconds: float
    backlogs: tuple[int, ...] = ()
    """W4: backlogs under which single claims are timed (``claim.backlog.N``)."""
    claim_samples: int = 300
    """W4: claim → complete rounds timed under each backlog."""
    processes: tuple[int, ...] = ()
    """W4: worker process counts for ``drain.processes.N``."""
    soak_seconds: float = 0.0
    """W6: length of the soak (0: no soak)."""
    soak_rate: float = 200.0
    keys: int = 64
    """Distinct ordering keys in ``drain.keyed10`` / ``drain.keyed100``."""
    sqlite_modes: tuple[str, ...] = ("full", "normal")
    """SQLite ``synchronous`` settings measured (one target each)."""
    keyed_batches: tuple[int, ...] = (10, 100)
    """Claim batches of the ordering-key drains."""
    unarchived_batches: tuple[int, ...] = (10, 100)
    """Claim batches of the drains with ``archive_completed=False``."""
    pg_commit_modes: tuple[str, ...] = ("on", "off")
    """PostgreSQL ``synchronous_commit`` settings measured (``off``: the
    ``postgresql-async`` target, for every contender)."""
    warmup: int = 20


QUICK = Sizes(
    mode="quick",
    repeats=3,
    publish_single=600,
    publish_batch=5_000,
    batch_size=500,
    drain=3_000,
    drain_threads=4,
    worker_concurrency=4,
    latency_rate=100.0,
    latency_seconds=2.0,
    sqlite_modes=("full",),
    keyed_batches=(10,),
    unarchived_batches=(100,),
    pg_commit_modes=("on",),
)
DEFAULT = Sizes(
    mode="default",
    repeats=3,
    publish_single=3_000,
    publish_batch=50_000,
    batch_size=500,
    drain=15_000,
    drain_threads=4,
    worker_concurrency=4,
    latency_rate=150.0,
    latency_seconds=10.0,
    backlogs=(10_000, 100_000, 1_000_000),
    processes=(1, 2, 4, 8),
    soak_seconds=600.0,
)


# --- databases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Database:
    """One fresh, empty database for one repetition."""

    target: str
    backend: str
    """``sqlite`` or ``postgresql``."""
    url: str
    """A sqlbroker URL (``sqlite:///…`` or ``postgresql://…``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Backend options for ``Broker(url, **options)`` (SQLite's ``synchronous``)."""
    path: str | None = None
    """SQLite only: the database file."""

    @property
    def conninfo(self) -> str:
        """PostgreSQL only: a libpq connection string."""
        assert self.backend == "postgresql"
        return self.url


class Target(Protocol):
    name: str
    backend: str

    def fresh(self) -> contextlib.AbstractContextManager[Database]: ...

    def describe(self) -> dict[str, Any]: ...


class SqliteTarget:
    """A new SQLite file in a new temporary directory per repetition (on the disk that holds
    the system temp directory: a tmpfs there would make fsync free and the numbers lie)."""

    backend = "sqlite"

    def __init__(self, synchronous: str) -> None:
        self.synchronous = synchronous
        self.name = f"sqlite-{synchronous}"
        self.parent = tempfile.gettempdir()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "sqlite",
            "synchronous": self.synchronous.upper(),
            "journal_mode": "WAL",
            "directory": self.parent,
            "filesystem": filesystem_type(self.parent),
        }

    @contextlib.contextmanager
    def fresh(self) -> Iterator[Database]:
        directory = tempfile.mkdtemp(prefix="sqlbroker-bench-")
        path = os.path.join(directory, "bench.db")
        try:
            yield Database(
                target=self.name,
                backend="sqlite",
                url=f"sqlite:///{path}",
                options={"synchronous": self.synchronous},
                path=path,
            )
        finally:
            shutil.rmtree(directory, ignore_errors=True)


class PostgresTarget:
    """A new database per repetition on one durable throwaway server (``fsync``,
    ``synchronous_commit`` and ``full_page_writes`` on, as PostgreSQL ships); with
    ``synchronous_commit="off"`` the databases commit without waiting for the WAL flush
    (``postgresql-async``: a crash may lose the last commits, never corrupt)."""

    backend = "postgresql"

    def __init__(self, server: Any, synchronous_commit: str = "on") -> None:
        self.server = server
        self.synchronous_commit = synchronous_commit
        self.name = "postgresql" if synchronous_commit == "on" else "postgresql-async"
        self._counter = 0

    def describe(self) -> dict[str, Any]:
        settings = {}
        for setting in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_level",
            "shared_buffers",
        ):
            settings[setting] = self.server.execute(f"SHOW {setting}")
        return {
            "backend": "postgresql",
            **settings,
            "synchronous_commit": self.synchronous_commit,
            "data_dir_filesystem": filesystem_type(str(self.server.data_dir)),
            "connection": "TCP 127.0.0.1",
        }

    @contextlib.contextmanager
    def fresh(self) -> Iterator[Database]:
        self._counter += 1
        name = f"bench_{os.getpid()}_{self._counter}"
        self.server.create_database(name)
        options: dict[str, Any] = {}
        if self.synchronous_commit != "on":
            # Every contender's sessions get it from the database; sqlbroker sets its own
            # per connection, so it is told through its option.
            setting = self.synchronous_commit
            self.server.execute(f"ALTER DATABASE {name} SET synchronous_commit = {setting}")
            options["synchronous_commit"] = setting
        try:
            yield Database(
                target=self.name,
                backend="postgresql",
                url=self.server.url(name),
                options=options,
            )
        finally:
            self.server.drop_database(name, missing_ok=True)


def start_postgres() -> Any:
    """Start a durable throwaway PostgreSQL with ``tests/pgserver.py`` (imported by path:
    ``tests/`` is not a package)."""
    tests_dir = str(REPO_DIR / "tests")
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from pgserver import PostgresServer

    server = PostgresServer(durable=True).start()
    pid_file = server.data_dir / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        OWN_ROOTS.append(int(pid_file.read_text().splitlines()[0]))
    return server


# --- noise: CPU used by everything else ------------------------------------------------------

OWN_ROOTS: list[int] = []
"""Processes whose CPU time (with all descendants) is ours: the PostgreSQL postmaster."""
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its descendants, the dead (reaped) ones included."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(entry)) is not None:
            pid = int(entry)
            parents[pid] = int(fields[1])
            # utime, stime, cutime, cstime (fields 14-17 of /proc/PID/stat)
            cpu[pid] = sum(int(x) for x in fields[11:15]) / _TICK
    total = 0.0
    for pid in cpu:
        walk = pid
        while walk > 1 and walk != root:
            walk = parents.get(walk, 1)
        if walk == root:
            total += cpu[pid]
    return total


def _machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return 0.0, 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq) / _TICK, steal / _TICK


class NoiseMeter:
    """How much CPU the rest of the machine used while a sample ran: busy CPU seconds of the
    machine minus ours (this process, its waited-for consumer processes and the PostgreSQL
    server tree), as a share of all cores over the wall time; plus hypervisor steal."""

    def __enter__(self) -> NoiseMeter:
        self._start = self._read()
        return self

    def _read(self) -> tuple[float, float, float, float]:
        times = os.times()
        ours = times.user + times.system + times.children_user + times.children_system
        ours += sum(_tree_cpu(root) for root in OWN_ROOTS)
        busy, steal = _machine_cpu()
        return time.monotonic(), busy, steal, ours

    def __exit__(self, *exc: object) -> None:
        end = self._read()
        wall = max(1e-9, end[0] - self._start[0]) * (os.cpu_count() or 1)
        others = (end[1] - self._start[1]) - (end[3] - self._start[3])
        self.other_cpu_pct = round(max(0.0, others) / wall * 100, 1)
        self.steal_pct = round((end[2] - self._start[2]) / wall * 100, 1)


# --- measurements ----------------------------------------------------------------------------


class BenchError(Exception):
    """A workload did not do what it claims (wrong count, a duplicate, a crashed worker)."""


@dataclass
class Sample:
    """One repetition's result: named metrics plus free-form details."""

    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)


Workload = Callable[[Database, Sizes], Sample]


@dataclass(frozen=True)
class Case:
    system: str
    target: Target
    workload: str
    run: Workload
    repeats: int | None = None
    """At most this many repetitions (default: the sizes' ``repeats``)."""


@dataclass
class Summary:
    median: float
    min: float
    max: float
    samples: list[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        return cls(
            median=statistics.median(values),
            min=min(values),
            max=max(values),
            samples=[round(v, 3) for v in values],
        )


@dataclass
class CaseResult:
    system: str
    target: str
    workload: str
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Summary]:
        names = self.samples[0].metrics if self.samples else {}
        return {name: Summary.of([s.metrics[name] for s in self.samples]) for name in names}

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "target": self.target,
            "workload": self.workload,
            "metrics": {name: asdict(s) for name, s in self.summary().items()},
            "details": [s.details for s in self.samples],
            "error": self.error,
        }


NOISY_RETRIES = 2
"""How many times a repetition disturbed by other processes is measured again."""


def run_cases(
    cases: Sequence[Case],
    *,
    sizes: Sizes,
    log: Callable[[str], None],
    max_noise: float = 25.0,
) -> list[CaseResult]:
    """Run every case ``repeats`` times, round-robin, each time on a fresh database.

    A repetition during which other processes used more than ``max_noise`` % of the
    machine's CPU is measured again (at most ``NOISY_RETRIES`` times; the last one is kept
    and flagged ``noisy``). A case that fails is reported once and not repeated; the others
    go on.
    """
    results = [CaseResult(c.system, c.target.name, c.workload) for c in cases]
    repeats = sizes.repeats
    for repeat in range(1, repeats + 1):
        for case, result in zip(cases, results, strict=True):
            if result.error is not None or repeat > (case.repeats or repeats):
                continue
            label = f"[{repeat}/{case.repeats or repeats}] {case.system:<10}"
            label += f" {case.target.name:<14} {case.workload}"
            for attempt in range(NOISY_RETRIES + 1):
                started = time.perf_counter()
                try:
                    with case.target.fresh() as database, NoiseMeter() as noise:
                        sample = case.run(database, sizes)
                except Exception as error:
                    result.error = f"{type(error).__name__}: {error}"
                    log(f"{label}: FAILED {result.error}")
                    break
                sample.details["other_cpu_pct"] = noise.other_cpu_pct
                sample.details["steal_pct"] = noise.steal_pct
                shown = ", ".join(f"{k}={v:,.1f}" for k, v in sample.metrics.items())
                took = time.perf_counter() - started
                noisy = noise.other_cpu_pct + noise.steal_pct > max_noise
                # A single long run (the soak) is not measured again: it reports its noise.
                if noisy and attempt < NOISY_RETRIES and case.repeats != 1:
                    log(f"{label}: {shown}  (other processes {noise.other_cpu_pct:.0f} %: again)")
                    continue
                if noisy:
                    sample.details["noisy"] = True
                result.samples.append(sample)
                log(f"{label}: {shown}  ({took:.1f} s, others {noise.other_cpu_pct:.0f} %)")
                break
    return results


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (``fraction`` in 0..1)."""
    if not values:
        raise BenchError("no values to take a percentile of")
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]


def call_timings(timings: dict[str, list[float]]) -> dict[str, Any]:
    """Per kind of database call: how many, and the mean and p99 time in ms (client side)."""
    summary: dict[str, Any] = {}
    for name, values in timings.items():
        if values:
            summary[f"{name}_calls"] = len(values)
            summary[f"{name}_mean_ms"] = round(sum(values) / len(values) * 1000, 3)
            summary[f"{name}_p99_ms"] = round(percentile(values, 0.99) * 1000, 3)
    return summary


# --- latency ---------------------------------------------------------------------------------

IDLE_SETTLE = 1.0
"""Seconds a latency consumer is left idle before the paced publishing starts, so that its
polling has backed off as on a quiet system."""


@dataclass
class Paced:
    details: dict[str, Any]
    returned: list[float]
    """``time.time()`` when each publish call returned (its commit was acknowledged)."""


def publish_paced(send: Callable[[int], None], *, rate: float, seconds: float) -> Paced:
    """Call ``send(i)`` on a fixed schedule; a late call is not followed by a burst."""
    count = int(rate * seconds)
    returned = []
    started = time.perf_counter()
    for i in range(count):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(i)
        returned.append(time.time())
    elapsed = time.perf_counter() - started
    details = {"messages": count, "target_rate": rate, "achieved_rate": round(count / elapsed, 1)}
    return Paced(details, returned)


def latency_sample(arrivals: Sequence[Sequence[float]], paced: Paced) -> Sample:
    """Latency from ``arrivals`` — ``(seq, publish time from the payload, handler start)`` —
    measured from the publish call (the metrics) and from its return (a detail: what is left
    once the commit itself is paid)."""
    if len(arrivals) != len(paced.returned):
        raise BenchError(f"{len(arrivals)} of {len(paced.returned)} messages arrived")
    seen = {int(seq) for seq, _, _ in arrivals}
    if len(seen) != len(arrivals):
        raise BenchError("a message reached the handler twice")
    from_call = [(arrived - sent) * 1000 for _, sent, arrived in arrivals]
    from_return = [(arrived - paced.returned[int(seq)]) * 1000 for seq, _, arrived in arrivals]
    return Sample(
        {
            "p50": percentile(from_call, 0.50),
            "p95": percentile(from_call, 0.95),
            "p99": percentile(from_call, 0.99),
        },
        {
            **paced.details,
            "max_ms": round(max(from_call), 3),
            "after_commit_p50_ms": round(percentile(from_return, 0.50), 3),
            "after_commit_p99_ms": round(percentile(from_return, 0.99), 3),
        },
    )


def emit(event: str, **fields: Any) -> None:
    """Report to the parent process (consumer side of :class:`Consumer`)."""
    print(json.dumps({"event": event, **fields}), flush=True)


def payload(seq: int) -> dict[str, Any]:
    """A ~200-byte JSON payload carrying its publish time (``time.time()``)."""
    return {"seq": seq, "t": time.time(), "kind": "bench", "body": "x" * 150}


def payload_size() -> int:
    return len(json.dumps(payload(10_000), separators=(",", ":")).encode())


# --- consumer subprocesses -------------------------------------------------------------------


class Consumer:
    """A consumer process (``bench/consumer.py``) that reports through JSON lines on stdout:
    ``{"event": "ready"}`` once it handles the first message, then one ``{"event": "done",
    …}`` line when it finishes."""

    def __init__(self, *args: str, timeout: float, gate: bool = False) -> None:
        self.timeout = timeout
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, str(BENCH_DIR / "consumer.py"), *args],
            stdin=subprocess.PIPE if gate else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=REPO_DIR,
        )

    def read_event(self, expected: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=self.timeout)
            raise BenchError(f"consumer exited before {expected!r}: {self.stderr_tail()}")
        event = json.loads(line)
        if event.get("event") != expected:
            raise BenchError(f"consumer said {event!r}, expected {expected!r}")
        return dict(event)

    def go(self) -> None:
        """Start a consumer started with ``gate=True`` (it waits for a line on stdin)."""
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self) -> dict[str, Any]:
        event = self.read_event("done")
        code = self.process.wait(timeout=self.timeout)
        if code != 0:
            raise BenchError(f"consumer exited with {code}: {self.stderr_tail()}")
        return event

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-3000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stderr.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_quiet(max_wait: float, log: Callable[[str], None], *, threshold: float = 10.0) -> None:
    """Wait (at most ``max_wait`` s) until other processes use less than ``threshold`` % of
    the machine's CPU over a few seconds: other work on a 2-core box moves every number."""
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        with NoiseMeter() as noise:
            time.sleep(3)
        if noise.other_cpu_pct < threshold:
            return
        log(f"other processes use {noise.other_cpu_pct:.0f} % of the CPU: waiting")
    if max_wait > 0:
        log("the machine stayed busy: measuring anyway (see other_cpu_pct in the results)")


# --- machine facts ---------------------------------------------------------------------------


def filesystem_type(path: str) -> str | None:
    """The filesystem type holding ``path`` per /proc/mounts (Linux), else ``None``."""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            entries = [line.split() for line in mounts]
    except OSError:
        return None
    path = os.path.realpath(path)
    best, kind = "", None
    for fields in entries:
        if len(fields) < 3:
            continue
        mount_point = fields[1]
        prefix = mount_point.rstrip("/") + "/"
        if (path == mount_point or path.startswith(prefix)) and len(mount_point) >= len(best):
            best, kind = mount_point, fields[2]
    return kind


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_DIR, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out


def fsync_probe_ms(directory: str, rounds: int = 200) -> float:
    """Median time of a 200-byte write + ``fdatasync`` in ``directory``: the price of one
    durable commit on this disk (a virtual disk may answer from the host's cache)."""
    fd, path = tempfile.mkstemp(dir=directory, prefix="fsync-probe-")
    timings = []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            os.write(fd, b"x" * 200)
            os.fdatasync(fd)
            timings.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    return round(statistics.median(timings), 3)


def machine_info() -> dict[str, Any]:
    import psycopg

    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gib": _memory_gib(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "psycopg": psycopg.__version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "temp_dir": tempfile.gettempdir(),
        "temp_dir_filesystem": filesystem_type(tempfile.gettempdir()),
        "fsync_probe_ms": fsync_probe_ms(tempfile.gettempdir()),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "payload_bytes": payload_size(),
    }
