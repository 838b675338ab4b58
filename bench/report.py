"""The frame every cost script's report shares: when the run started, how long it took, the
machine's cores and load average at the start and at the end, and the two files it writes
(``--out``.json and ``--out``.md).

    run = Run()
    report = {"started": run.started_at, "rounds": 6, "backends": {}}
    ...                                   # measure, fill the report
    report.update(run.stamp())            # "seconds", "load_average"
    lines = ["# Title", "", f"{run.header(report)} · what was measured.", ...]
    write(args.out, report, lines)
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class Run:
    """A run's clock and load, taken when it starts."""

    def __init__(self) -> None:
        self.started = time.time()
        self.load_before = os.getloadavg()
        self.started_at = datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds")

    def stamp(self) -> dict[str, Any]:
        """The report's ``seconds`` and ``load_average`` (start and now)."""
        return {
            "seconds": round(time.time() - self.started),
            "load_average": {"start": self.load_before, "end": os.getloadavg()},
        }

    def header(self, report: dict[str, Any]) -> str:
        """The first line under a report's title: start, seconds, cores, load average."""
        return (
            f"{report['started']} · {report['seconds']} s · {os.cpu_count()} cores · load average"
            f" {[round(x, 1) for x in self.load_before]} at the start,"
            f" {[round(x, 1) for x in os.getloadavg()]} at the end"
        )


def write(out: str | Path, report: dict[str, Any], lines: list[str]) -> None:
    """Write ``out``.json (the report) and ``out``.md (the lines)."""
    path = Path(out)
    path.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
