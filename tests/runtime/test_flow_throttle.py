"""A worker held back by a rate limit sleeps until the next claim is due (docs/flow-control.md):
publishes meanwhile (each of which wakes an idle worker) do not make it claim again. Its
claims are counted by wrapping the worker's own claim operation (the database is real)."""

from __future__ import annotations

import threading
from typing import Any

import sqlbroker
from runtime.support import wait_until

LIMIT = 60.0


def test_a_throttled_worker_does_not_claim_on_every_publish(broker: sqlbroker.Broker) -> None:
    broker.backend.subscription_ensure(name="payments")
    broker.backend.subscription_ensure(name="quiet")
    broker.set_flow("payments", rate_limit="1/hour")
    handled: list[Any] = []
    claims: list[str] = []
    ops = broker.backend.async_ops
    claim = ops.message_claim_many

    async def counted(**arguments: Any) -> Any:
        claims.append(arguments["subscription"])
        return await claim(**arguments)

    ops.message_claim_many = counted  # type: ignore[method-assign]

    @broker.subscriber(queue="payments")
    def pay(msg: sqlbroker.Message) -> None:
        handled.append(msg.payload)

    @broker.subscriber(queue="quiet")
    def other(msg: sqlbroker.Message) -> None:
        handled.append(msg.payload)

    broker.send("payments", 0)
    runner = threading.Thread(
        target=broker.run,
        # The poll (30 s) is far longer than the test: only hints or the rate limit's own
        # wait could bring a claim.
        kwargs={"install_signal_handlers": False, "timeout": LIMIT, "poll_interval": 30.0},
        daemon=True,
    )
    runner.start()
    try:
        wait_until(lambda: handled == [0], timeout=LIMIT, what="the first payment")
        throttled_claims = claims.count("payments")
        for n in range(1, 21):
            broker.send("payments", n)  # each one a hint to the payments worker
        broker.send("quiet", "done")  # a hint handled after those: they have all arrived
        wait_until(lambda: "done" in handled, timeout=LIMIT, what="the quiet message")
    finally:
        broker.stop()
        runner.join(LIMIT)
    assert handled == [0, "done"]
    # At most one claim more (a claim already under way when the first payment ran).
    assert claims.count("payments") - throttled_claims <= 1
    (flow,) = broker.flow("payments")
    assert flow.throttled
