"""A progress display for long pipeline runs: the current step, and Spark's active stages
with their finished and total tasks, refreshed while the step runs."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class PipelineProgress:
    """``with PipelineProgress(spark) as progress: progress.step("…")``; quiet when the
    output is not a terminal unless ``force`` is set."""

    def __init__(self, spark: Any, *, console: Console | None = None, enabled: bool = True) -> None:
        self._spark = spark
        self._console = console or Console(stderr=True)
        self._enabled = enabled
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} tasks"),
            TimeElapsedColumn(),
            console=self._console,
            transient=False,
        )
        self._task: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps: list[tuple[str, float]] = []
        self._started = time.monotonic()

    def __enter__(self) -> Self:
        if self._enabled:
            self._progress.start()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def step(self, description: str) -> None:
        """Start a new step (the previous one is done)."""
        self._finish_step()
        self.steps.append((description, time.monotonic()))
        if self._enabled:
            self._task = self._progress.add_task(description, total=None)

    def _finish_step(self) -> None:
        if self._enabled and self._task is not None:
            task = self._progress.tasks[-1]
            total = task.total or task.completed or 1
            self._progress.update(self._task, total=total, completed=total)

    def _poll(self) -> None:
        tracker = self._spark.sparkContext.statusTracker()
        while not self._stop.wait(0.5):
            try:
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            except Exception:  # the JVM is shutting down: nothing left to show
                return
            stages = [s for s in stages if s is not None]
            if stages and self._task is not None:
                self._progress.update(
                    self._task,
                    total=sum(s.numTasks for s in stages),
                    completed=sum(s.numCompletedTasks for s in stages),
                )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._enabled:
            if error is None:
                self._finish_step()
            self._progress.stop()
