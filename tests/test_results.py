"""Stored results (docs/results.md): a handler's return value kept with its copy, the error
of a dead-lettered one, ``result(message_id, wait=, subscription=)`` on both faces, woken by
a notification (PostgreSQL) or the change watcher (SQLite), retention, and the CLI.
Both backends; the database is real."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

import sqlbroker
from helpers import table_counts
from runtime.support import run_until_idle, wait_until
from sqlbroker.core.settlements import Lease, Settlement
from sqlbroker.features import results as results_feature
from sqlbroker.interfaces.cli.app import cli


def _result_rows(broker: sqlbroker.Broker) -> int:
    return table_counts(broker.backend)["sqlbroker_result"]


def test_a_returned_value_is_stored_and_read_back(broker: sqlbroker.Broker) -> None:
    @broker.subscriber(queue="calc")
    def calc(msg: sqlbroker.Message) -> Any:
        return {"double": msg.payload * 2, "text": "é", "items": [1, 2.5, None, True]}

    @broker.subscriber(queue="acalc")
    async def acalc(msg: sqlbroker.Message) -> Any:
        return [msg.payload, "async"]

    sync_id = broker.send("calc", 21)
    async_id = broker.send("acalc", 7)
    assert broker.result(sync_id) is None, "not finished yet"
    run_until_idle(broker)

    found = broker.result(sync_id)
    assert found is not None
    assert found.outcome == "completed"
    assert found.ok
    assert found.value == {"double": 42, "text": "é", "items": [1, 2.5, None, True]}
    assert found.subscription == "calc"
    assert found.message_id == sync_id
    assert found.error is None
    assert found.reason is None
    later = broker.result(async_id)
    assert later is not None
    assert later.value == [7, "async"]
    assert _result_rows(broker) == 2


def test_a_none_return_stores_nothing_and_reads_as_completed(broker: sqlbroker.Broker) -> None:
    @broker.subscriber(queue="quiet")
    def quiet(msg: sqlbroker.Message) -> None:
        return None

    message_id = broker.send("quiet", 1)
    run_until_idle(broker)
    assert _result_rows(broker) == 0, "a None result writes no row"
    found = broker.result(message_id)
    assert found is not None
    assert (found.outcome, found.value) == ("completed", None)


def test_a_value_over_the_limit_or_not_json_dead_letters_the_copy(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True, payload_limit=1000) as broker:

        @broker.subscriber(queue="big")
        def big(msg: sqlbroker.Message) -> Any:
            return "x" * 2000 if msg.payload == "big" else {1, 2}

        too_big = broker.send("big", "big")
        not_json = broker.send("big", "set")
        run_until_idle(broker)
        assert _result_rows(broker) == 0
        for message_id, problem in ((too_big, "the limit is 1000 bytes"), (not_json, "not JSON")):
            found = broker.result(message_id)
            assert found is not None
            assert found.outcome == "dead"
            assert found.error is not None
            assert found.error.type == "sqlbroker.InvalidPayload"
            assert problem in found.error.message
            assert found.reason is not None
            assert "return value cannot be stored" in found.reason
        dead = broker.dead_letters.list(subscription="big")
        assert [d.attempts for d in dead] == [1, 1], "not retried: it would come back again"


def test_a_dead_lettered_copy_reports_its_error(broker: sqlbroker.Broker) -> None:
    @broker.subscriber(queue="fails", retry=sqlbroker.RetryPolicy(max_attempts=1))
    def fails(msg: sqlbroker.Message) -> None:
        raise ValueError("the card was declined")

    message_id = broker.send("fails", {"order": 1})
    run_until_idle(broker)
    found = broker.result(message_id)
    assert found is not None
    assert found.outcome == "dead"
    assert not found.ok
    assert found.value is None
    assert found.error is not None
    assert (found.error.type, found.error.message) == ("ValueError", "the card was declined")
    assert found.error.traceback is not None
    assert "ValueError" in found.error.traceback
    assert found.reason


def test_results_work_without_the_archive(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True, archive_completed=False) as broker:

        @broker.subscriber(queue="lean")
        def lean(msg: sqlbroker.Message) -> Any:
            return msg.payload or None

        valued = broker.send("lean", "kept")
        empty = broker.send("lean", 0)
        run_until_idle(broker)
        assert broker.archive("lean") == []
        found = broker.result(valued)
        assert found is not None
        assert (found.outcome, found.value) == ("completed", "kept")
        # Nothing at all is left of a None completion without the archive.
        with pytest.raises(sqlbroker.NotFound, match="unknown"):
            broker.result(empty)


def test_bad_arguments_raise_validation_errors_and_unknown_ids_not_found(
    broker: sqlbroker.Broker,
) -> None:
    with pytest.raises(sqlbroker.InvalidName, match="message_id"):
        broker.result("not-a-uuid")
    with pytest.raises(sqlbroker.InvalidName, match="message_id"):
        broker.result(42)  # type: ignore[arg-type]
    message_id = broker.send("q", 1)
    with pytest.raises(sqlbroker.InvalidDuration, match="wait"):
        broker.result(message_id, wait=-1)
    with pytest.raises(sqlbroker.InvalidDuration, match="wait"):
        broker.result(message_id, wait=float("nan"))
    with pytest.raises(sqlbroker.InvalidName, match="subscription"):
        broker.result(message_id, subscription="bad name")
    with pytest.raises(sqlbroker.NotFound, match="unknown"):
        broker.result("0192f0c4-0000-7000-8000-000000000000")
    with pytest.raises(sqlbroker.NotFound, match="no copy in subscription other"):
        broker.result(message_id, subscription="other")
    with pytest.raises(sqlbroker.InvalidDuration, match="result_ttl"):
        sqlbroker.Broker("sqlite:///:memory:", result_ttl=0)


def test_a_fanned_out_message_needs_a_subscription(broker: sqlbroker.Broker) -> None:
    broker.subscribe("billing", "orders.*")
    broker.subscribe("emails", "orders.#")

    @broker.subscriber("billing", topics="orders.*")
    def bill(msg: sqlbroker.Message) -> Any:
        return {"billed": msg.payload}

    message_id = broker.publish("orders.created", 5)
    with pytest.raises(sqlbroker.InvalidOption, match=r"2 subscriptions \(billing, emails\)"):
        broker.result(message_id)
    run_until_idle(broker)
    found = broker.result(message_id, subscription="billing")
    assert found is not None
    assert found.value == {"billed": 5}
    assert broker.result(message_id, subscription="emails") is None, "emails has no handler"
    with pytest.raises(sqlbroker.InvalidOption, match="emails"):
        broker.result(message_id, wait=0.1)


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fallback look would come only after the wait is over: whatever a waiting lookup
    returns, a hint woke it."""
    monkeypatch.setattr(results_feature, "FALLBACK_POLL", 3600.0)


def _watching(broker: sqlbroker.Broker) -> bool:
    """Whether a result watch is in place (its LISTEN connection, or its watcher thread)."""
    if broker.backend_name == "sqlite":
        return any(thread.name == "sqlbroker-result" for thread in threading.enumerate())
    with broker.backend.begin() as conn_tx:
        conn = conn_tx.connection
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%_result%%'"
        ).fetchone()
    return bool(row[0])


def _wait_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as error:
            box["error"] = error

    thread = threading.Thread(target=run, name="result-waiter")
    thread.start()
    return thread, box


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("fails", [False, True], ids=["completed", "dead"])
def test_a_waiting_lookup_wakes_on_the_notification(broker: sqlbroker.Broker, fails: bool) -> None:
    release = threading.Event()

    @broker.subscriber(queue="slow", retry=sqlbroker.RetryPolicy(max_attempts=1))
    def slow(msg: sqlbroker.Message) -> Any:
        release.wait(30)
        if fails:
            raise RuntimeError("gave up")
        return {"done": msg.payload}

    message_id = broker.send("slow", "job")
    thread, box = _wait_in_thread(lambda: broker.result(message_id, wait=30))
    wait_until(lambda: _watching(broker), timeout=20, what="the result watch")
    release.set()
    run_until_idle(broker)
    thread.join(40)
    assert not thread.is_alive()
    assert "error" not in box, box
    found = box["result"]
    assert found is not None, "the wait ended without its hint"
    if fails:
        assert found.outcome == "dead"
        assert found.error.message == "gave up"
    else:
        assert (found.outcome, found.value) == ("completed", {"done": "job"})
    assert broker._results.fallback_polls == 0


def test_a_copy_that_vanishes_without_a_record_reads_as_completed(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL sends no notification for a None completion: the fallback look finds it.
    monkeypatch.setattr(results_feature, "FALLBACK_POLL", 0.05)
    with sqlbroker.Broker(backend_url, migrate=True, archive_completed=False) as broker:

        @broker.subscriber(queue="none")
        def none(msg: sqlbroker.Message) -> None:
            return None

        message_id = broker.send("none", 1)
        thread, box = _wait_in_thread(lambda: broker.result(message_id, wait=30))
        wait_until(lambda: _watching(broker), timeout=20, what="the result watch")
        run_until_idle(broker)
        thread.join(40)
        found = box["result"]
        assert found is not None
        assert (found.outcome, found.value) == ("completed", None)


def test_a_wait_that_runs_out_returns_none(broker: sqlbroker.Broker) -> None:
    message_id = broker.send("nobody", 1)
    assert broker.result(message_id, wait=0.2) is None


def test_results_are_trimmed_after_their_retention(
    backend_url: str, clock: sqlbroker.ManualClock
) -> None:
    with sqlbroker.Broker(backend_url, migrate=True, clock=clock, result_ttl=3600) as broker:

        @broker.subscriber(queue="kept")
        def kept(msg: sqlbroker.Message) -> Any:
            return msg.payload

        old = broker.send_many("kept", [1, 2, 3])
        run_until_idle(broker)
        clock.advance(1800)
        fresh = broker.send("kept", 4)
        run_until_idle(broker)
        assert broker.reap()["results_trimmed"] == 0
        clock.advance(1801)
        assert broker.reap(limit=2)["results_trimmed"] == 2, "in bounded batches"
        assert broker.reap()["results_trimmed"] == 1
        assert _result_rows(broker) == 1
        found = broker.result(fresh)
        assert found is not None
        assert found.value == 4
        # The archive still has the old completions, but not their values.
        with pytest.raises(sqlbroker.NotFound, match="no longer kept"):
            broker.result(old[0])


def test_the_async_face_matches_and_wakes(
    broker: sqlbroker.Broker, backend_url: str, no_fallback: None
) -> None:
    sync_signature = inspect.signature(sqlbroker.Broker.result)
    async_signature = inspect.signature(sqlbroker.AsyncBroker.result)
    assert sync_signature == async_signature

    release = threading.Event()

    @broker.subscriber(queue="twin")
    def twin(msg: sqlbroker.Message) -> Any:
        release.wait(30)
        return msg.payload + 1

    message_id = broker.send("twin", 1)

    async def main() -> Any:
        async with sqlbroker.AsyncBroker(backend_url) as face:
            with pytest.raises(sqlbroker.InvalidDuration):
                await face.result(message_id, wait=-1)
            assert await face.result(message_id) is None
            waiting = asyncio.ensure_future(face.result(message_id, wait=30))
            await asyncio.to_thread(
                wait_until, lambda: _watching(broker), timeout=20, what="the watch"
            )
            release.set()
            await asyncio.to_thread(run_until_idle, broker)
            found = await waiting
            assert face._results.fallback_polls == 0
            return found

    found = asyncio.run(main())
    assert found is not None
    assert (found.outcome, found.value) == ("completed", 2)


def test_the_cli_shows_a_result_and_exits_by_outcome(backend_url: str) -> None:
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        broker.subscribe("a", "fan.*")
        broker.subscribe("b", "fan.*")

        @broker.subscriber(queue="cli")
        def handle(msg: sqlbroker.Message) -> Any:
            return {"answer": msg.payload}

        done = broker.send("cli", 42)
        pending = broker.send("idle", 1)
        fanned = broker.publish("fan.out", 1)
        run_until_idle(broker)

    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["--url", backend_url, "result", *args])

    shown = run(done)
    assert shown.exit_code == 0, shown.output
    assert "completed" in shown.output
    assert '{"answer":42}' in shown.output
    as_json = run(done, "--json")
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)["value"] == {"answer": 42}

    for args, code, text in (
        (("nope",), 2, "not a message id"),
        ((done, "--wait", "-1"), 2, "wait"),
        ((fanned,), 2, "pass subscription="),
        ((pending,), 1, "not finished yet"),
        ((pending, "--wait", "0.1"), 1, "after waiting 0.1 s"),
        (("0192f0c4-0000-7000-8000-000000000000",), 1, "unknown"),
    ):
        outcome = run(*args)
        assert outcome.exit_code == code, (args, outcome.output)
        lines = outcome.output.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: "), lines
        assert text in lines[0], lines
    assert run(fanned, "--subscription", "a").exit_code == 1, "a has no handler"


def test_manual_acks_and_the_low_level_api_store_a_result(broker: sqlbroker.Broker) -> None:
    @broker.subscriber(queue="manual", ack="manual")
    def manual(msg: sqlbroker.Message) -> None:
        with pytest.raises(sqlbroker.InvalidPayload, match="result"):
            msg.ack(result={"not", "json"})
        msg.ack(result={"acked": msg.payload})

    by_ack = broker.send("manual", 1)
    run_until_idle(broker)
    found = broker.result(by_ack)
    assert found is not None
    assert found.value == {"acked": 1}

    own = broker.send_many("own", [1, 2])
    first, second = broker.claim("own", limit=2)
    with pytest.raises(sqlbroker.InvalidOption, match="one delivery at a time"):
        broker.complete([first, second], result=1)
    with pytest.raises(sqlbroker.InvalidPayload, match="result"):
        broker.complete(first, result="x" * (broker.publish_defaults.payload_limit + 1))
    assert len(broker.pending("own")) == 2, "nothing was written"
    broker.complete(first, result=[first.payload])
    broker.complete(second)
    results = [broker.result(message_id) for message_id in own]
    assert [(r.outcome, r.value) for r in results if r is not None] == [
        ("completed", [1]),
        ("completed", None),
    ]
    assert sqlbroker.Result in (type(r) for r in results)
    assert "Result" in sqlbroker.__all__


def test_the_async_low_level_complete_stores_a_result(backend_url: str) -> None:
    async def main() -> Any:
        async with sqlbroker.AsyncBroker(backend_url, migrate=True) as face:
            message_id = await face.send("async-own", 3)
            (delivery,) = await face.claim("async-own")
            with pytest.raises(sqlbroker.InvalidOption, match="one delivery"):
                await face.complete([], result=1)
            await face.complete(delivery, result={"tripled": 9})
            return await face.result(message_id)

    found = asyncio.run(main())
    assert found is not None
    assert found.value == {"tripled": 9}


def _watchers(broker: sqlbroker.Broker) -> int:
    """How many result watches are open: LISTEN connections, or watcher threads."""
    if broker.backend_name == "sqlite":
        return sum(thread.name == "sqlbroker-result" for thread in threading.enumerate())
    with broker.backend.begin() as conn_tx:
        conn = conn_tx.connection
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%_result%%'"
        ).fetchone()
    return int(row[0])


@pytest.mark.usefixtures("no_fallback")
def test_many_waiting_lookups_share_one_watch(broker: sqlbroker.Broker) -> None:
    release = threading.Event()

    @broker.subscriber(queue="many", concurrency=4)
    def many(msg: sqlbroker.Message) -> Any:
        release.wait(30)
        return msg.payload * 10

    # Watches of other brokers still open in this process (a Celery result backend's
    # broker is never closed by Celery) count too: this broker adds exactly one.
    before = _watchers(broker)
    message_ids = broker.send_many("many", list(range(12)))
    waiting = [
        _wait_in_thread(lambda m=message_id: broker.result(m, wait=30))
        for message_id in message_ids
    ]
    wait_until(lambda: _watchers(broker) > before, timeout=20, what="the result watch")
    assert _watchers(broker) == before + 1
    release.set()
    run_until_idle(broker)
    values = []
    for thread, box in waiting:
        thread.join(40)
        assert "error" not in box, box
        values.append(box["result"].value)
    assert values == [n * 10 for n in range(12)]
    assert broker._results.fallback_polls == 0


def test_the_seam_refuses_a_copy_settled_twice_in_one_call(broker: sqlbroker.Broker) -> None:
    broker.send("seam", 1)
    (delivery,) = broker.claim("seam")
    lease = Lease.of(delivery)
    twice = [Settlement.complete(lease, b"1"), Settlement.complete(lease, b"2")]
    with pytest.raises(sqlbroker.InvalidOption, match="settle each copy once per call"):
        broker.backend.message_settle_many(settlements=twice)
    assert len(broker.pending("seam")) == 1, "nothing was written"
    valued = Settlement.complete(lease, b'{"a":1}')
    assert broker.backend.message_settle_many(settlements=[valued]) == [delivery.id]
    found = broker.result(delivery.message_id)
    assert found is not None
    assert found.value == {"a": 1}


def test_a_mixed_batch_stores_only_its_values(broker: sqlbroker.Broker) -> None:
    first_id, second_id, third_id = broker.send_many("mixed", [1, 2, 3])
    leases = [Lease.of(d) for d in broker.claim("mixed", limit=3)]
    values = [b"[1]", None, b'"three"']
    settlements = [Settlement.complete(lease, v) for lease, v in zip(leases, values, strict=True)]
    assert len(broker.backend.message_settle_many(settlements=settlements)) == 3
    assert _result_rows(broker) == 2
    results = [broker.result(m) for m in (first_id, second_id, third_id)]
    assert [(r.outcome, r.value) for r in results if r is not None] == [
        ("completed", [1]),
        ("completed", None),
        ("completed", "three"),
    ]


@pytest.mark.postgres
@pytest.mark.usefixtures("no_fallback")
def test_channels_of_a_long_schema_name_fit_and_still_wake(pg_url: str) -> None:
    """PostgreSQL names a channel with at most 63 bytes: the channels of a schema with a
    long name are shortened by one rule (a hash keeps two long names apart), and a waiting
    lookup still wakes on the result's notification."""
    long_names = ("s" * 63, "s" * 62 + "t")
    with (
        sqlbroker.Broker(pg_url, schema=long_names[0], migrate=True) as broker,
        sqlbroker.Broker(pg_url, schema=long_names[1], migrate=True) as other,
    ):
        channels = [
            getattr(opened.backend, f"{kind}_channel")
            for opened in (broker, other)
            for kind in ("notify", "dead", "result", "cancel")
        ]
        assert max(len(channel.encode()) for channel in channels) <= 63, channels
        assert len(set(channels)) == len(channels), channels

        message_id = broker.send("long", "job")
        thread, box = _wait_in_thread(lambda: broker.result(message_id, wait=30))
        wait_until(lambda: _watching(broker), timeout=20, what="the result watch")
        (delivery,) = broker.claim("long")
        broker.complete(delivery, result={"done": "job"})
        thread.join(40)
        assert not thread.is_alive()
        assert "error" not in box, box
        found = box["result"]
        assert (found.outcome, found.value) == ("completed", {"done": "job"})
        assert broker._results.fallback_polls == 0
