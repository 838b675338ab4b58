"""The catalog of workloads: what each measures, its metrics, and its raw-SQL reference.

Every system implements the workloads it can under these names, so results line up across
systems and targets. ``reference`` names the floor workload a sqlbroker result is divided
by for the "÷ floor" ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import Sizes


@dataclass(frozen=True)
class WorkloadInfo:
    name: str
    metrics: tuple[str, ...]
    unit: str
    higher_is_better: bool
    reference: str | None
    """The floor's workload a sqlbroker result is divided by (``None``: no floor ratio)."""
    summary: str
    peer_reference: str | None = None
    """The peers' workload it is compared with (default: the one of the same name)."""
    baseline: str | None = None
    """sqlbroker's own workload it is divided by (what a feature costs), if any."""
    repeats: int | None = None
    """Run at most this many times (the soak: once)."""


BACKLOGS = {
    n: f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1000}k"
    for n in (10_000, 100_000, 1_000_000)
}
PROCESSES = (1, 2, 4, 8)
THROUGHPUT = ("rate",)
LATENCY = ("p50", "p95", "p99")

WORKLOADS: dict[str, WorkloadInfo] = {
    info.name: info
    for info in (
        WorkloadInfo(
            "publish.single",
            THROUGHPUT,
            "msg/s",
            True,
            "publish.single",
            "one producer thread, one message per transaction (`send`)",
        ),
        WorkloadInfo(
            "publish.routed",
            THROUGHPUT,
            "msg/s",
            True,
            None,
            "as publish.single, to a topic that two subscriptions' patterns match (`publish`,"
            " fan-out on write: two copies per message): what routing costs",
            baseline="publish.single",
        ),
        WorkloadInfo(
            "publish.batch",
            THROUGHPUT,
            "msg/s",
            True,
            "publish.batch",
            "one producer thread, 500 messages per transaction (`send_many`)",
        ),
        WorkloadInfo(
            "drain.runtime",
            THROUGHPUT,
            "msg/s",
            True,
            "drain.claim10",
            "a worker process, `run_until_idle`, concurrency 4, async no-op handler"
            " (floor: its 4-thread claim-10 loop)",
            peer_reference="drain.claim10",
        ),
        WorkloadInfo(
            "drain.claim10",
            THROUGHPUT,
            "msg/s",
            True,
            "drain.claim10",
            "4 threads looping claim(limit=10) → complete",
        ),
        WorkloadInfo(
            "drain.claim100",
            THROUGHPUT,
            "msg/s",
            True,
            "drain.claim100",
            "4 threads looping claim(limit=100) → complete",
        ),
        WorkloadInfo(
            "drain.keyed10",
            THROUGHPUT,
            "msg/s",
            True,
            None,
            "as drain.claim10 with an ordering key on every message (64 keys): what per-key"
            " ordering costs",
            baseline="drain.claim10",
        ),
        WorkloadInfo(
            "drain.keyed100",
            THROUGHPUT,
            "msg/s",
            True,
            None,
            "as drain.claim100 with an ordering key on every message (64 keys)",
            baseline="drain.claim100",
        ),
        *(
            WorkloadInfo(
                f"drain.unarchived{batch}",
                THROUGHPUT,
                "msg/s",
                True,
                None,
                f"as drain.claim{batch} with `archive_completed=False` (an ack deletes the"
                " copy and keeps no archive row, as pgmq's delete): what the archive costs",
                peer_reference=f"drain.claim{batch}",
                baseline=f"drain.claim{batch}",
            )
            for batch in (10, 100)
        ),
        WorkloadInfo(
            "latency",
            LATENCY,
            "ms",
            False,
            "latency",
            "publish at a fixed rate into an idle running worker; publish time → handler start",
        ),
        *(
            WorkloadInfo(
                f"claim.backlog.{label}",
                ("p50", "p99"),
                "ms",
                False,
                f"claim.backlog.{label}",
                f"one claim(limit=10) → complete at a time with {backlog:,} messages"
                " waiting; the claim call's time",
            )
            for backlog, label in BACKLOGS.items()
        ),
        *(
            WorkloadInfo(
                f"claim.backlog.keyed.{label}",
                ("p50", "p99"),
                "ms",
                False,
                None,
                f"as claim.backlog.{label} with an ordering key on every message (64 keys):"
                " each ack promotes its key's next copy",
                baseline=f"claim.backlog.{label}",
            )
            for label in BACKLOGS.values()
        ),
        *(
            WorkloadInfo(
                f"drain.processes.{n}",
                THROUGHPUT,
                "msg/s",
                True,
                None,
                f"{n} worker process(es), concurrency 4 each, draining together",
            )
            for n in PROCESSES
        ),
        WorkloadInfo(
            "soak",
            (
                "p99_first_ms",
                "p99_last_ms",
                "rss_first_mb",
                "rss_last_mb",
                "hot_first_kb",
                "hot_last_kb",
                "dead_tuples_max",
            ),
            "",
            False,
            None,
            "a fixed publish rate into a running worker for a long time: latency, worker"
            " RSS, the hot table's size and dead tuples in the first and last minute",
            repeats=1,
        ),
    )
}


def enabled(name: str, sizes: Sizes) -> bool:
    """Whether workload ``name`` runs at these sizes (W4 and W6 only in full runs)."""
    if name.startswith("claim.backlog."):
        return any(backlog_label(n) == name.rsplit(".", 1)[1] for n in sizes.backlogs)
    if name.startswith("drain.processes."):
        return int(name.rsplit(".", 1)[1]) in sizes.processes
    if name.startswith("drain.keyed"):
        return int(name.removeprefix("drain.keyed")) in sizes.keyed_batches
    if name.startswith("drain.unarchived"):
        return int(name.removeprefix("drain.unarchived")) in sizes.unarchived_batches
    if name == "soak":
        return sizes.soak_seconds > 0
    return True


def backlog_label(count: int) -> str:
    return f"{count // 1_000_000}m" if count >= 1_000_000 else f"{count // 1000}k"
