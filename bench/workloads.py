"""The catalog of workloads: what each measures, its metrics, and its raw-SQL reference.

Every system implements the workloads it can under these names, so results line up across
systems and targets. ``reference`` names the floor workload a sqlbroker result is divided
by for the "÷ floor" ratio.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadInfo:
    name: str
    metrics: tuple[str, ...]
    unit: str
    higher_is_better: bool
    reference: str | None
    summary: str


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
            "latency",
            LATENCY,
            "ms",
            False,
            "latency",
            "publish at a fixed rate into an idle running worker; publish time → handler start",
        ),
    )
}
