"""The worker's scheduler side task: on by default, off with ``schedules=False``."""

from __future__ import annotations

import pytest

import sqlbroker
from runtime.support import wait_until


@pytest.mark.parametrize("enabled", [True, False])
def test_the_worker_publishes_schedule_ticks_unless_disabled(
    broker: sqlbroker.Broker, enabled: bool
) -> None:
    handled: list[str] = []

    @broker.subscriber(name="beats", topics=["beat.#"])
    async def on_beat(msg: sqlbroker.Message) -> None:
        handled.append(msg.headers["sqlbroker-tick"])
        if len(handled) >= 3:
            broker.stop()

    broker.subscribe("beats", ["beat.#"])
    broker.schedule("beat", "beat.fast", {}, every=0.05, missed="all")
    # With the scheduler the handler stops the worker after three ticks; without it the
    # timeout does, with nothing published (the ticks are due all along).
    broker.run(timeout=30 if enabled else 1.5, install_signal_handlers=False, schedules=enabled)
    if enabled:
        assert len(handled) >= 3
        assert len(set(handled)) == len(handled)
    else:
        assert handled == []
        assert broker.pending("beats") == []
        assert broker.schedules()[0].last_run_at is None
        wait_until(lambda: broker.run_due_schedules().published, timeout=10, what="a due tick")
