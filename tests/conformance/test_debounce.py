"""Debounce and replace (docs/flow-control.md, "Debounce and replace"), both backends: a
keyed publish with ``replace=True`` takes the place of its key's pending copy instead of
queueing another; ``debounce`` also waits for quiet, never past ``debounce_max``; a copy
already claimed is never touched; bad options raise a ValidationError and write nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

import sqlbroker
from helpers import table_counts
from sqlbroker import State
from sqlbroker.features.publishing import PublishOptions
from sqlbroker.interfaces.cli import cli


def _queued(broker: sqlbroker.Broker, subscription: str) -> list[tuple[str, State]]:
    return [(m.message_id, m.state) for m in broker.pending(subscription, limit=1000)]


def test_a_burst_of_replacing_sends_is_delivered_once_with_the_last_payload(
    broker: sqlbroker.Broker,
) -> None:
    ids = [broker.send("sync", {"version": n}, key="doc-1", replace=True) for n in range(5)]
    other = broker.send("sync", {"version": 0}, key="doc-2", replace=True)
    assert len(set(ids)) == 5
    assert sorted(_queued(broker, "sync")) == sorted(
        [(ids[-1], State.AVAILABLE), (other, State.AVAILABLE)]
    )
    delivered = {d.message_id: d.payload for d in broker.claim("sync", limit=10)}
    assert delivered == {ids[-1]: {"version": 4}, other: {"version": 0}}


def test_a_replaced_copy_keeps_its_place_and_takes_the_new_headers(
    broker: sqlbroker.Broker,
) -> None:
    first = broker.send("sync", "a", key="k1", headers={"rev": "1"}, replace=True)
    broker.send("sync", "b", key="k2")
    last = broker.send("sync", "c", key="k1", headers={"rev": "2"}, priority=0, replace=True)
    assert first != last
    (head, second) = broker.claim("sync", limit=10)
    assert (head.message_id, head.payload, head.headers, head.priority) == (
        last,
        "c",
        {"rev": "2"},
        0,
    )
    assert second.payload == "b"


def test_a_claimed_copy_is_not_replaced_a_new_copy_queues_behind_it(
    broker: sqlbroker.Broker,
) -> None:
    broker.send("sync", {"v": 1}, key="doc", replace=True)
    (running,) = broker.claim("sync", limit=10)
    second = broker.send("sync", {"v": 2}, key="doc", replace=True)
    third = broker.send("sync", {"v": 3}, key="doc", replace=True)
    assert running.payload == {"v": 1}
    assert _queued(broker, "sync") == [
        (running.message_id, State.RUNNING),
        (third, State.BLOCKED),
    ]
    assert second != third
    assert broker.claim("sync", limit=10) == []
    broker.complete(running)
    (after,) = broker.claim("sync", limit=10)
    assert (after.message_id, after.payload) == (third, {"v": 3})


def test_a_retrying_copy_is_not_replaced(broker: sqlbroker.Broker) -> None:
    broker.send("sync", {"v": 1}, key="doc", replace=True)
    (running,) = broker.claim("sync", limit=10)
    broker.retry(running, after=0)
    newer = broker.send("sync", {"v": 2}, key="doc", replace=True)
    (again,) = broker.claim("sync", limit=10)
    assert (again.message_id, again.payload, again.attempt) == (running.message_id, {"v": 1}, 2)
    broker.complete(again)
    (last,) = broker.claim("sync", limit=10)
    assert (last.message_id, last.payload) == (newer, {"v": 2})


def test_replace_matches_the_topic_and_each_subscription_on_its_own(
    broker: sqlbroker.Broker,
) -> None:
    broker.subscribe("index", "doc.*")
    broker.subscribe("audit", "doc.*")
    created = broker.publish("doc.created", {"v": 0}, key="d1", replace=True)
    broker.publish("doc.updated", {"v": 1}, key="d1", replace=True)
    (audit_head,) = broker.claim("audit", limit=1)
    assert audit_head.message_id == created
    latest = broker.publish("doc.updated", {"v": 2}, key="d1", replace=True)
    # index: created, then the updated copy replaced in place (another topic is never
    # replaced); audit: created is running, so its pending update took the new payload.
    assert [(m.topic, m.message_id) for m in broker.pending("index")] == [
        ("doc.created", created),
        ("doc.updated", latest),
    ]
    assert [(m.topic, m.message_id) for m in broker.pending("audit")] == [
        ("doc.created", created),
        ("doc.updated", latest),
    ]


def test_send_many_with_replace_keeps_the_last_payload(broker: sqlbroker.Broker) -> None:
    ids = broker.send_many("sync", [{"v": n} for n in range(4)], key="doc", replace=True)
    batch = broker.publish_many(
        [
            {"topic": "sync", "payload": {"v": 9}, "key": "other", "replace": True},
            {"topic": "sync", "payload": {"v": 10}, "key": "doc", "replace": True},
        ]
    )
    assert len(ids) == 4
    delivered = sorted((d.payload["v"], d.message_id) for d in broker.claim("sync", limit=10))
    assert delivered == sorted([(10, batch[1]), (9, batch[0])])


def test_a_duplicate_idempotency_key_replaces_nothing(broker: sqlbroker.Broker) -> None:
    first = broker.send("sync", {"v": 1}, key="doc", idempotency_key="op-1", replace=True)
    again = broker.send("sync", {"v": 1}, key="doc", idempotency_key="op-1", replace=True)
    newer = broker.send("sync", {"v": 2}, key="doc", idempotency_key="op-2", replace=True)
    assert again == first
    (delivery,) = broker.claim("sync", limit=10)
    assert (delivery.message_id, delivery.payload) == (newer, {"v": 2})


def test_debounce_waits_for_quiet(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    broker = clocked_broker
    broker.send("index", {"v": 1}, key="doc", debounce=10)
    clock.advance(6)
    assert broker.claim("index", limit=10) == []
    last = broker.send("index", {"v": 2}, key="doc", debounce=10)
    clock.advance(6)  # 12 s after the first publish, 6 s after the last
    assert broker.claim("index", limit=10) == []
    clock.advance(4.5)
    (delivery,) = broker.claim("index", limit=10)
    assert (delivery.message_id, delivery.payload) == (last, {"v": 2})


def test_debounce_max_bounds_the_wait_of_a_steady_stream(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    broker = clocked_broker
    published = []
    for n in range(4):  # a publish every 8 s, each within the 10 s debounce of the last
        published.append(broker.send("index", n, key="doc", debounce=10, debounce_max=25))
        if n < 3:
            clock.advance(8)
            assert broker.claim("index", limit=10) == []
    clock.advance(0.5)  # 24.5 s after the first publish
    assert broker.claim("index", limit=10) == []
    clock.advance(1)  # 25.5 s: the maximum wait is over, though the stream is not quiet
    (delivery,) = broker.claim("index", limit=10)
    assert (delivery.message_id, delivery.payload) == (published[-1], 3)
    nxt = broker.send("index", 4, key="doc", debounce=timedelta(seconds=10))
    clock.advance(10.5)
    broker.complete(delivery)
    (following,) = broker.claim("index", limit=10)
    assert (following.message_id, following.payload) == (nxt, 4)


def test_a_debounced_send_behind_a_running_copy_waits_its_turn_and_its_time(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    broker = clocked_broker
    broker.send("index", 1, key="doc")
    (running,) = broker.claim("index", limit=10)
    broker.send("index", 2, key="doc", debounce=10)
    clock.advance(5)
    last = broker.send("index", 3, key="doc", debounce=10)
    broker.complete(running)
    clock.advance(6)
    assert broker.claim("index", limit=10) == []
    clock.advance(5)
    (delivery,) = broker.claim("index", limit=10)
    assert (delivery.message_id, delivery.payload) == (last, 3)


_AT = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({"replace": True}, sqlbroker.InvalidOption, "replace"),
        ({"debounce": 5}, sqlbroker.InvalidOption, "debounce"),
        ({"key": "k", "replace": "yes"}, sqlbroker.InvalidOption, "replace"),
        ({"key": "k", "debounce": 0}, sqlbroker.InvalidDuration, "debounce"),
        ({"key": "k", "debounce": -1}, sqlbroker.InvalidDuration, "debounce"),
        ({"key": "k", "debounce": float("nan")}, sqlbroker.InvalidDuration, "debounce"),
        (
            {"key": "k", "debounce": 10, "debounce_max": 5},
            sqlbroker.InvalidDuration,
            "debounce_max",
        ),
        ({"key": "k", "debounce_max": 5}, sqlbroker.InvalidOption, "debounce_max"),
        ({"key": "k", "replace": True, "debounce_max": 5}, sqlbroker.InvalidOption, "debounce_max"),
        ({"key": "k", "debounce": 5, "delay": 1}, sqlbroker.InvalidOption, "debounce"),
        ({"key": "k", "debounce": 5, "at": _AT}, sqlbroker.InvalidOption, "debounce"),
        ({"key": "k", "debounce": 5, "ttl": 5}, sqlbroker.InvalidDuration, "ttl"),
    ],
)
def test_bad_replace_options_write_nothing(
    broker: sqlbroker.Broker, options: dict[str, Any], error: type[Exception], field: str
) -> None:
    broker.send("sync", "before", key="k")
    before = table_counts(broker.backend)
    with pytest.raises(error) as raised:
        broker.send("sync", "after", **options)
    assert getattr(raised.value, "field", None) == field
    with pytest.raises(error):
        broker.publish_many([{"topic": "sync", "payload": "after", **options}])
    assert table_counts(broker.backend) == before


def test_the_async_broker_replaces_and_debounces_the_same_way(backend_url: str) -> None:
    # Both faces take the publish options as one TypedDict (tests/test_api_faces.py).
    assert {"replace", "debounce", "debounce_max"} <= PublishOptions.__optional_keys__

    async def main() -> list[Any]:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as broker:
            for n in range(3):
                await broker.send("sync", n, key="doc", replace=True)
            await broker.send("sync", "x", key="other", debounce=30)
            return [d.payload for d in await broker.claim("sync", limit=10)]

    assert asyncio.run(main()) == [2]


def test_the_cli_sends_with_replace_and_debounce(backend_url: str) -> None:
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(cli, ["--url", backend_url, *args])
        return result.exit_code, result.stdout, result.stderr

    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        assert run("send", "sync", '{"v": 1}', "--key", "doc", "--replace")[0] == 0
        code, out, _ = run(
            "send", "sync", '{"v": 2}', "--key", "doc", "--debounce", "30s", "--debounce-max", "2m"
        )
        assert code == 0
        assert [(m.message_id, m.state) for m in broker.pending("sync")] == [
            (out.strip(), State.SCHEDULED)
        ]
        before = table_counts(broker.backend)
        for args in (("--debounce", "30"), ("--key", "doc", "--debounce", "0")):
            code, out, err = run("send", "sync", "3", *args)
            assert (code, out, err.count("\n")) == (2, "", 1)
            assert err.startswith("error: debounce: ")
        assert table_counts(broker.backend) == before


def _replaced(broker: sqlbroker.Broker) -> dict[str, int]:
    return {s.subscription: s.replaced for s in broker.stats()}


def test_stats_count_the_replaced_publishes_per_subscription(broker: sqlbroker.Broker) -> None:
    broker.subscribe("index", "doc.*")
    broker.subscribe("audit", "doc.*")
    broker.publish("doc.updated", {"v": 0}, key="d1", replace=True)
    broker.publish("doc.updated", {"v": 1}, key="d1", replace=True)  # replaces in both
    broker.claim("audit", limit=1)
    broker.publish("doc.updated", {"v": 2}, key="d1", debounce=30)  # index only: audit runs
    broker.publish("doc.updated", {"v": 3}, key="d2", replace=True)  # nothing to replace
    broker.send_many("sync", [{"v": n} for n in range(4)], key="doc", replace=True)
    assert _replaced(broker) == {"audit": 1, "index": 2, "sync": 3}


def test_the_cli_stats_show_the_replaced_publishes(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        for n in range(3):
            broker.send("sync", n, key="doc", replace=True)
    result = CliRunner().invoke(cli, ["--url", backend_url, "stats", "--json"])
    assert result.exit_code == 0, result.output
    assert '"replaced": 2' in result.stdout


@pytest.mark.postgres
def test_a_replacing_publish_still_wakes_the_workers(pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    with sqlbroker.Broker(pg_url, migrate=True) as broker:
        broker.send("sync", 1, key="doc", replace=True)
        channel = broker.backend.notify_channel
        with psycopg.connect(pg_url, autocommit=True) as listener:
            listener.execute(f'LISTEN "{channel}"')
            broker.send("sync", 2, key="doc", replace=True)
            woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken == ["sync"]


def test_prometheus_counts_the_replaced_publishes(broker: sqlbroker.Broker) -> None:
    pytest.importorskip("prometheus_client")
    from sqlbroker.interfaces.prometheus import exposition, registry_for

    for n in range(3):
        broker.send("sync", n, key="doc", replace=True)
    text = exposition(registry_for(broker)).decode()
    assert 'sqlbroker_messages_total{outcome="replaced",subscription="sync"} 2.0' in text
