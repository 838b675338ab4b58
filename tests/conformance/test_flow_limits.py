"""Flow limits (docs/flow-control.md) through the public API, the worker and the CLI, both
backends: caps hold across brokers and restarts, fairness lets a quiet key through a
10,000-message burst, a throttled subscription shows in stats and Prometheus, bad values
are the same ValidationError on both backends before any SQL, and the CLI's errors are one
line with exit code 2."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

import pytest
from click.testing import CliRunner

import sqlbroker
from helpers import table_counts
from sqlbroker.core.flow import FLOW_OPTIONS
from sqlbroker.interfaces.cli import cli


def test_max_running_holds_across_brokers_and_restarts(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("orders", "order.*")
        flow = broker.set_flow("orders", max_running=3)
        assert (flow.limits.max_running, flow.running, flow.throttled) == (3, 0, False)
        broker.publish_many([{"topic": "order.placed", "payload": n} for n in range(10)])
    with sqlbroker.Broker(backend_url) as first, sqlbroker.Broker(backend_url) as second:
        taken = first.claim("orders", limit=2) + second.claim("orders", limit=10)
        assert len(taken) == 3
        assert first.claim("orders", limit=10) == []
        (flow,) = second.flow("orders")
        assert (flow.running, flow.at_cap, flow.throttled) == (3, True, True)
        (stats,) = second.stats()
        assert (stats.running, stats.throttled) == (3, True)
        first.complete(taken[0])
        assert len(second.claim("orders", limit=10)) == 1


def test_changes_keep_the_limits_not_named(broker: sqlbroker.Broker) -> None:
    broker.subscribe("orders", "order.*")
    broker.set_flow("orders", max_running=5, rate_limit="100/min")
    flow = broker.set_flow("orders", key_concurrency=2, rate_limit=None)
    assert flow.limits == sqlbroker.FlowLimits(max_running=5, key_concurrency=2)
    flow = broker.set_flow("orders", reset=True, fair=True)
    assert flow.limits == sqlbroker.FlowLimits(fair=True)
    assert str(broker.set_flow("orders", rate_limit="10/30s").limits.rate_limit) == "10/30s"


def test_fair_claims_a_quiet_key_within_a_burst(broker: sqlbroker.Broker) -> None:
    broker.subscribe("tenants", "job.*")
    broker.set_flow("tenants", fair=True, key_concurrency=10_000)
    for start in range(0, 10_000, 1000):
        broker.publish_many(
            [{"topic": "job.run", "payload": n, "key": "noisy"} for n in range(start, start + 1000)]
        )
    quiet = broker.publish("job.run", "quiet", key="quiet")
    first = broker.claim("tenants", limit=5)
    assert quiet in [d.message_id for d in first]
    assert sorted(str(d.key) for d in first).count("noisy") == 4


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_running": 0}, "max_running"),
        ({"max_running": -1}, "max_running"),
        ({"max_running": True}, "max_running"),
        ({"max_running": "3"}, "max_running"),
        ({"key_concurrency": -5}, "key_concurrency"),
        ({"rate_limit": "0/min"}, "rate_limit"),
        ({"rate_limit": "10/0s"}, "rate_limit"),
        ({"rate_limit": "ten per minute"}, "rate_limit"),
        ({"rate_limit": "5/fortnight"}, "rate_limit"),
        ({"rate_limit": "-5/s"}, "rate_limit"),
        ({"rate_limit": 100}, "rate_limit"),
        ({"key_rate_limit": "1/0.0001s"}, "key_rate_limit"),
        ({"fair": 1}, "fair"),
        ({"max_runing": 3}, "max_runing"),
        ({"max_running": 3, "burst": 5}, "burst"),
    ],
)
def test_bad_values_are_refused_before_any_sql(
    broker: sqlbroker.Broker, options: dict[str, Any], field: str
) -> None:
    broker.subscribe("orders", "order.*")
    before = (table_counts(broker.backend), broker.flow("orders"))
    if field not in FLOW_OPTIONS:  # an unknown keyword of a typed signature: Python's own
        with pytest.raises(TypeError, match=field):
            broker.set_flow("orders", **options)
        assert (table_counts(broker.backend), broker.flow("orders")) == before
        return
    with pytest.raises(sqlbroker.ValidationError) as raised:
        broker.set_flow("orders", **options)
    assert str(raised.value).startswith(f"{field}: ")
    with pytest.raises(sqlbroker.ValidationError):
        broker.subscriber(queue="q", **options)(lambda msg: None)
    # The same refusal, word for word, for an unknown subscription: nothing is looked up.
    with pytest.raises(sqlbroker.ValidationError) as again:
        broker.set_flow("missing", **options)
    assert str(again.value) == str(raised.value)
    assert (table_counts(broker.backend), broker.flow("orders")) == before


def test_an_unknown_subscription_is_not_found(broker: sqlbroker.Broker) -> None:
    before = table_counts(broker.backend)
    with pytest.raises(sqlbroker.NotFound):
        broker.set_flow("missing", max_running=1)
    with pytest.raises(sqlbroker.NotFound):
        broker.flow("missing")
    assert table_counts(broker.backend) == before


def test_a_subscriber_declares_its_limits_at_worker_start(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.send("reports", {"n": 1})
        broker.set_flow("reports", fair=True)
        done = threading.Event()

        @broker.subscriber(queue="reports", max_running=2, rate_limit="50/s")
        def build(msg: sqlbroker.Message) -> None:
            done.set()

        worker = threading.Thread(
            target=broker.run, kwargs={"install_signal_handlers": False}, daemon=True
        )
        worker.start()
        try:
            assert done.wait(30)
        finally:
            broker.stop()
            worker.join(30)
        (flow,) = broker.flow("reports")
    assert flow.limits == sqlbroker.FlowLimits(max_running=2, rate_limit=sqlbroker.Rate(50, 1.0))


def test_prometheus_shows_throttling(broker: sqlbroker.Broker) -> None:
    pytest.importorskip("prometheus_client")
    from sqlbroker.interfaces.prometheus import exposition, registry_for

    broker.subscribe("orders", "order.*")
    broker.subscribe("emails", "user.*")
    broker.set_flow("orders", rate_limit="1/hour")
    broker.publish_many([{"topic": "order.placed", "payload": n} for n in range(2)])
    assert len(broker.claim("orders", limit=10)) == 1
    text = exposition(registry_for(broker)).decode()
    assert 'sqlbroker_subscription_throttled{subscription="orders"} 1.0' in text
    assert 'sqlbroker_subscription_throttled{subscription="emails"} 0.0' in text
    (line,) = [
        line
        for line in text.splitlines()
        if line.startswith('sqlbroker_subscription_throttled_seconds{subscription="orders"}')
    ]
    assert 3500 < float(line.split()[-1]) <= 3600


def test_the_async_broker_sets_flow_the_same_way(backend_url: str) -> None:
    async def main() -> sqlbroker.Flow:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            await broker.subscribe("orders", "order.*")
            await broker.set_flow("orders", max_running=4)
            (flow,) = await broker.flow("orders")
            return flow

    assert asyncio.run(main()).limits.max_running == 4
    for name in ("flow", "set_flow"):
        sync = inspect.signature(getattr(sqlbroker.Broker, name))
        asynchronous = inspect.signature(getattr(sqlbroker.AsyncBroker, name))
        assert sync.parameters == asynchronous.parameters


def test_the_cli_shows_and_sets_flow_limits(backend_url: str) -> None:
    runner = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "200"})
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("orders", "order.*")

    def run(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(cli, ["--url", backend_url, *args])
        return result.exit_code, result.stdout, result.stderr

    code, out, _ = run(
        "subscriptions", "flow", "orders", "--max-running", "3", "--rate", "100/min", "--fair"
    )
    assert code == 0
    assert "100/min" in out
    code, out, _ = run("subscriptions", "flow", "orders", "--max-running", "none", "--json")
    assert code == 0
    assert '"max_running": null' in out
    assert '"fair": true' in out
    for args, message in [
        (("--max-running", "-1"), "error: max_running: must be from 1 to 1000000, not -1\n"),
        (("--max-running", "lots"), None),
        (("--rate", "5/fortnight"), None),
        (("--key-rate", "0/s"), None),
    ]:
        assert run("subscriptions", "flow", "orders", *args)[:2] == (2, "")
        code, out, err = run("subscriptions", "flow", "orders", *args)
        assert err.startswith("error: ")
        assert err.count("\n") == 1
        if message is not None:
            assert err == message
    code, out, err = run("subscriptions", "flow", "missing", "--fair")
    assert (code, out, err) == (1, "", "error: no subscription named 'missing'\n")
    with sqlbroker.Broker(backend_url) as broker:
        (flow,) = broker.flow("orders")
    assert flow.limits == sqlbroker.FlowLimits(rate_limit=sqlbroker.Rate(100, 60.0), fair=True)
