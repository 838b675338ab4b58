"""SqlBroker, the FastStream broker on sqlbroker, in one process: FastStream's test client
(dependency injection, validation, publishers), its AsyncAPI document, each ack policy and
``Ack``/``Nack``/``Reject`` mapped onto sqlbroker's outcomes on both backends, publishing in
the caller's transaction, and bad configuration refused with one clear error."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import pytest

pytest.importorskip("faststream")

from faststream import Context
from faststream.exceptions import AckMessage, NackMessage, RejectMessage
from faststream.message import AckStatus
from faststream.middlewares import AckPolicy
from faststream.specification import AsyncAPI
from pydantic import BaseModel, ValidationError

import sqlbroker
from runtime.support import wait_until
from sqlbroker.contrib.faststream import SqlBroker, SqlMessage, SqlRouter, TestSqlBroker


class Order(BaseModel):
    id: int
    total: float


def shop(url: str = "sqlite:///unused.db") -> tuple[SqlBroker, Any, Any]:
    broker = SqlBroker(url)

    @broker.subscriber("orders")
    @broker.publisher("orders.done")
    async def handle(order: Order) -> dict[str, Any]:
        return {"id": order.id, "paid": order.total > 0}

    @broker.subscriber("orders.*", group="audit")
    async def audit(body: dict[str, Any]) -> None:
        pass

    return broker, handle, audit


def test_the_test_client_injects_validates_and_publishes_the_result() -> None:
    broker, handle, audit = shop()

    async def scenario() -> None:
        async with TestSqlBroker(broker) as br:
            await br.publish({"id": "7", "total": 2.5}, "orders")
            handle.mock.assert_called_once_with({"id": "7", "total": 2.5})
            # the handler's result went to orders.done, which the audit group matches
            audit.mock.assert_called_once_with({"id": 7, "paid": True})

    asyncio.run(scenario())


def test_the_test_client_raises_the_validation_error_of_a_bad_payload() -> None:
    broker, _, audit = shop()

    async def scenario() -> None:
        async with TestSqlBroker(broker) as br:
            with pytest.raises(ValidationError, match="total"):
                await br.publish({"id": 1}, "orders")
            assert audit.mock.call_count == 0

    asyncio.run(scenario())


def test_a_router_prefixes_its_topics_and_a_result_goes_to_reply_to() -> None:
    broker = SqlBroker("sqlite:///unused.db")
    router = SqlRouter(prefix="shop.")

    @router.subscriber("orders")
    async def handle(body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": body["id"]}

    @broker.subscriber("answers")
    async def answers(body: dict[str, Any]) -> None:
        pass

    broker.include_router(router)

    async def scenario() -> None:
        async with TestSqlBroker(broker) as br:
            await br.publish({"id": 3}, "orders", reply_to="answers")
            assert handle.mock.call_count == 0  # "orders" is not the router's topic
            await br.publish({"id": 4}, "shop.orders", reply_to="answers")
            handle.mock.assert_called_once_with({"id": 4})
            answers.mock.assert_called_once_with({"ok": 4})

    asyncio.run(scenario())


def test_the_message_carries_the_body_bytes_headers_and_ids() -> None:
    broker = SqlBroker("sqlite:///unused.db")
    seen: list[SqlMessage] = []

    @broker.subscriber("orders")
    async def handle(body: Any, message: Annotated[SqlMessage, Context()]) -> None:
        seen.append(message)

    async def scenario() -> None:
        async with TestSqlBroker(broker) as br:
            await br.publish({"id": 1, "note": "café"}, "orders", headers={"tenant": "acme"})
            await br.publish(b"\x00raw", "orders")

    asyncio.run(scenario())
    first, second = seen
    assert json.loads(first.body) == {"id": 1, "note": "café"}
    assert first.content_type == "application/json"
    assert first.headers["tenant"] == "acme"
    assert first.message_id == first.raw_message.id
    assert first.attempt == 1
    assert second.body == b"\x00raw"
    assert second.content_type is None  # published without one: FastStream's guess applies


def test_the_asyncapi_document_lists_the_channels_without_the_password() -> None:
    broker, _, _ = shop("postgresql://app:secret@db.example:5432/shop")
    document = AsyncAPI(broker, schema_version="3.0.0").to_specification().to_jsonable()
    addresses = {channel["address"] for channel in document["channels"].values()}
    assert addresses == {"orders", "orders.done", "orders.*"}
    server = next(iter(document["servers"].values()))
    assert server["protocol"] == "postgresql"
    assert "secret" not in str(document)
    payloads = str(document["components"]["schemas"])
    assert "total" in payloads  # the Order model of the handler's signature


# --- ack policies on a real database ------------------------------------------------------

Behaviour = Callable[[SqlMessage], Awaitable[None]]


async def boom(message: SqlMessage) -> None:
    raise RuntimeError("boom")


async def nack_then_ack(message: SqlMessage) -> None:
    if message.attempt == 1:
        await message.nack(delay=0)
    else:
        await message.ack()


async def nack_exception_once(message: SqlMessage) -> None:
    if message.attempt == 1:
        raise NackMessage(delay=0)


async def reject_exception(message: SqlMessage) -> None:
    raise RejectMessage(reason="not for this shop")


async def ack_exception(message: SqlMessage) -> None:
    raise AckMessage()


CASES: dict[str, tuple[AckPolicy | None, Behaviour, str, int, str]] = {
    # name: (policy, handler, outcome, attempts, reason fragment)
    "nack-on-error-by-default": (None, boom, "dead", 2, "max attempts exhausted (2 of 2)"),
    "reject-on-error": (AckPolicy.REJECT_ON_ERROR, boom, "dead", 1, "RuntimeError: boom"),
    "ack-on-error": (AckPolicy.ACK, boom, "completed", 1, ""),
    "ack-first": (AckPolicy.ACK_FIRST, boom, "completed", 1, ""),
    "manual": (AckPolicy.MANUAL, nack_then_ack, "completed", 2, ""),
    "manual-raises-unsettled": (AckPolicy.MANUAL, boom, "dead", 2, "max attempts exhausted"),
    "nack-exception": (None, nack_exception_once, "completed", 2, ""),
    "reject-exception": (None, reject_exception, "dead", 1, "not for this shop"),
    "ack-exception": (AckPolicy.REJECT_ON_ERROR, ack_exception, "completed", 1, ""),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ack_policies_map_onto_sqlbroker_outcomes(
    backend_url: str, broker: sqlbroker.Broker, case: str
) -> None:
    policy, behaviour, outcome, attempts, reason = CASES[case]
    app = SqlBroker(backend_url, poll_interval=0.1)
    options: dict[str, Any] = {} if policy is None else {"ack_policy": policy}

    @app.subscriber(
        "jobs", retry=sqlbroker.RetryPolicy(base=0.05, cap=0.05, jitter="none"), **options
    )
    async def job(body: dict[str, Any], message: Annotated[SqlMessage, Context()]) -> None:
        await behaviour(message)

    async def scenario() -> str:
        await app.start()
        try:
            message_id = await app.publish({"n": 1}, "jobs", max_attempts=2)
            await asyncio.to_thread(
                wait_until,
                lambda: broker.archive("jobs") or broker.dead_letters.list(subscription="jobs"),
                timeout=30,
                what=f"the {case} message to end",
            )
        finally:
            await app.stop()
        return message_id

    message_id = asyncio.run(scenario())
    if outcome == "completed":
        [row] = broker.archive("jobs")
        assert row.outcome.value == "completed"
        assert not broker.dead_letters.list(subscription="jobs")
    else:
        [row] = broker.dead_letters.list(subscription="jobs")
        assert not broker.archive("jobs")
        assert reason in row.reason
    assert row.message_id == message_id
    assert row.attempts == attempts


def test_a_subscriber_started_while_the_broker_runs_gets_a_worker_of_its_own(
    backend_url: str, broker: sqlbroker.Broker
) -> None:
    app = SqlBroker(backend_url, poll_interval=0.1)
    seen: list[Any] = []

    @app.subscriber("first")
    async def first(body: Any) -> None:
        pass

    async def scenario() -> None:
        await app.start()
        try:
            late = app.subscriber("late")

            @late
            async def handle(body: dict[str, Any]) -> None:
                seen.append(body)

            await late.start()
            await app.publish({"n": 1}, "late")
            await asyncio.to_thread(
                wait_until, lambda: broker.archive("late"), timeout=30, what="the late handler"
            )
            await late.stop()
            await app.publish({"n": 2}, "late")  # kept for the next start
        finally:
            await app.stop()

    asyncio.run(scenario())
    assert seen == [{"n": 1}]
    assert len(broker.pending("late")) == 1


def _execute(url: str, sql: str) -> list[Any]:
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            rows = conn.execute(sql).fetchall()
            conn.commit()
            return rows
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


def test_a_handler_s_writes_and_its_ack_commit_together(
    backend_url: str, broker: sqlbroker.Broker
) -> None:
    _execute(backend_url, "CREATE TABLE payments (order_id INTEGER PRIMARY KEY)")
    app = SqlBroker(backend_url, poll_interval=0.1)
    handled: list[SqlMessage] = []

    @app.subscriber("payments", ack_policy=AckPolicy.REJECT_ON_ERROR)
    async def pay(body: dict[str, Any], message: Annotated[SqlMessage, Context()]) -> None:
        handled.append(message)
        async with message.raw_message.transaction() as conn:
            done = conn.execute(f"INSERT INTO payments (order_id) VALUES ({int(body['id'])})")
            if inspect.isawaitable(done):
                await done

    async def scenario() -> None:
        await app.start()
        try:
            await app.publish({"id": 7}, "payments")
            await asyncio.to_thread(
                wait_until, lambda: broker.archive("payments"), timeout=30, what="the payment"
            )
        finally:
            await app.stop()

    asyncio.run(scenario())
    [row] = broker.archive("payments")
    assert row.outcome.value == "completed"
    assert row.attempts == 1
    assert _execute(backend_url, "SELECT order_id FROM payments") == [(7,)]
    # FastStream's ack after the handler saw the message already settled, and kept quiet
    assert handled[0].committed is AckStatus.ACKED


@pytest.mark.parametrize("policy", [None, AckPolicy.REJECT_ON_ERROR])
def test_a_payload_failing_validation_is_dead_lettered_with_the_fields_at_fault(
    backend_url: str, broker: sqlbroker.Broker, policy: AckPolicy | None
) -> None:
    app = SqlBroker(backend_url, poll_interval=0.1)
    options: dict[str, Any] = {} if policy is None else {"ack_policy": policy}

    @app.subscriber("orders", **options)
    async def handle(order: Order) -> None:
        pass

    async def scenario() -> None:
        await app.start()
        try:
            await app.publish({"id": "seven"}, "orders")
            await asyncio.to_thread(
                wait_until,
                lambda: broker.dead_letters.list(subscription="orders"),
                timeout=30,
                what="the dead letter",
            )
        finally:
            await app.stop()

    asyncio.run(scenario())
    [dead] = broker.dead_letters.list(subscription="orders")
    assert dead.attempts == 1
    assert dead.reason.startswith("invalid payload (")
    assert "order.id: Input should be a valid integer" in dead.reason
    assert "order.total: Field required" in dead.reason


# --- publishing in the caller's transaction -------------------------------------------------


def open_caller_connection(url: str) -> Any:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        return conn
    import psycopg

    return psycopg.connect(url)


@pytest.mark.parametrize("ending", ["rollback", "commit"])
def test_publish_with_conn_joins_the_caller_s_transaction(
    backend_url: str, broker: sqlbroker.Broker, ending: str
) -> None:
    broker.subscribe("orders", ["orders"])
    app = SqlBroker(backend_url)

    async def scenario() -> None:
        await app.connect()
        conn = open_caller_connection(backend_url)
        try:
            await app.publish({"id": 1, "total": 3}, "orders", conn=conn)
            # not visible to anyone before the caller commits
            assert broker.pending("orders") == []
            getattr(conn, ending)()
        finally:
            conn.close()
            await app.stop()

    asyncio.run(scenario())
    pending = broker.pending("orders")
    assert len(pending) == (1 if ending == "commit" else 0)


@pytest.mark.postgres
@pytest.mark.parametrize("ending", ["rollback", "commit"])
def test_publish_with_an_async_psycopg_connection_joins_its_transaction(
    pg_url: str, ending: str
) -> None:
    import psycopg

    with sqlbroker.Broker(pg_url) as broker:
        broker.subscribe("orders", ["orders"])
        app = SqlBroker(pg_url)

        async def scenario() -> None:
            await app.connect()
            conn = await psycopg.AsyncConnection.connect(pg_url)
            try:
                await app.publish({"id": 1}, "orders", conn=conn)
                assert broker.pending("orders") == []
                await getattr(conn, ending)()
            finally:
                await conn.close()
                await app.stop()

        asyncio.run(scenario())
        assert len(broker.pending("orders")) == (1 if ending == "commit" else 0)


@pytest.mark.parametrize("ending", ["rollback", "commit"])
def test_publish_batch_writes_every_message_in_one_transaction(
    backend_url: str, broker: sqlbroker.Broker, ending: str
) -> None:
    broker.subscribe("orders", ["orders"])
    app = SqlBroker(backend_url)

    async def scenario() -> list[str]:
        await app.connect()
        conn = open_caller_connection(backend_url)
        try:
            ids = await app.publish_batch({"id": 1}, {"id": 2}, "three", topic="orders", conn=conn)
            assert broker.pending("orders") == []
            getattr(conn, ending)()
            plain = await app.publish_batch({"id": 4}, topic="orders", priority=0)
        finally:
            conn.close()
            await app.stop()
        return [*ids, *plain]

    ids = asyncio.run(scenario())
    assert len(set(ids)) == 4
    pending = broker.pending("orders")
    expected = ids[3:] if ending == "rollback" else ids
    assert sorted(m.message_id for m in pending) == sorted(expected)


def test_the_test_client_delivers_a_batch_message_by_message() -> None:
    broker, handle, _ = shop()

    async def scenario() -> None:
        async with TestSqlBroker(broker) as br:
            await br.publish_batch({"id": 1, "total": 1}, {"id": 2, "total": 2}, topic="orders")
            assert handle.mock.call_count == 2

    asyncio.run(scenario())


def test_a_publisher_object_publishes_with_its_options_and_a_caller_connection(
    backend_url: str, broker: sqlbroker.Broker
) -> None:
    broker.subscribe("orders", ["orders"])
    app = SqlBroker(backend_url)
    urgent = app.publisher("orders", priority=sqlbroker.URGENT, headers={"source": "web"})

    async def scenario() -> list[str]:
        await app.connect()
        conn = open_caller_connection(backend_url)
        try:
            rolled_back = await urgent.publish({"id": 1}, conn=conn)
            conn.rollback()
            kept = await urgent.publish({"id": 2}, headers={"tenant": "acme"})
        finally:
            conn.close()
            await app.stop()
        return [rolled_back, kept]

    rolled_back, kept = asyncio.run(scenario())
    [pending] = broker.pending("orders")
    assert pending.message_id == kept != rolled_back
    assert pending.priority == sqlbroker.URGENT
    [delivery] = broker.claim("orders")
    assert delivery.headers["source"] == "web"
    assert delivery.headers["tenant"] == "acme"
    assert delivery.payload == {"id": 2}


def test_a_publish_replaces_or_debounces_the_key_s_pending_copy(
    backend_url: str, broker: sqlbroker.Broker
) -> None:
    broker.subscribe("orders", ["orders"])
    app = SqlBroker(backend_url)
    debounced = app.publisher("orders", key="cart-9", debounce=60)

    async def scenario() -> list[str]:
        await app.connect()
        try:
            ids = [
                await app.publish({"v": n}, "orders", key="cart-7", replace=True) for n in (1, 2)
            ]
            ids += [await debounced.publish({"v": n}) for n in (3, 4)]
        finally:
            await app.stop()
        return ids

    ids = asyncio.run(scenario())
    pending = {m.key: m for m in broker.pending("orders")}
    assert sorted(pending) == ["cart-7", "cart-9"]
    assert pending["cart-7"].message_id == ids[1]
    assert pending["cart-9"].message_id == ids[3]
    assert pending["cart-9"].state == "scheduled"
    [delivery] = broker.claim("orders")
    assert delivery.payload == {"v": 2}


# --- bad configuration and bad input ----------------------------------------------------------


def test_an_unknown_url_scheme_is_one_clear_error() -> None:
    with pytest.raises(sqlbroker.InvalidURL, match="unsupported database 'mysql'"):
        SqlBroker("mysql://db/shop")


def test_a_missing_extra_is_one_clear_error() -> None:
    code = "import sys; sys.modules['faststream'] = None\nimport sqlbroker.contrib.faststream"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: sqlbroker.contrib.faststream needs FastStream:"
        " pip install 'sqlbroker[faststream]'"
    )


def test_a_wildcard_subscriber_needs_a_group() -> None:
    app = SqlBroker("sqlite:///unused.db")
    with pytest.raises(sqlbroker.InvalidOption, match="group"):
        app.subscriber("orders.*")
    with pytest.raises(sqlbroker.InvalidName):
        app.subscriber("orders..created")


def test_bad_publish_input_is_refused_before_anything_is_written(
    backend_url: str, broker: sqlbroker.Broker
) -> None:
    broker.subscribe("orders", ["orders"])
    app = SqlBroker(backend_url)

    async def scenario() -> None:
        await app.connect()
        try:
            with pytest.raises(sqlbroker.InvalidHeaders):
                await app.publish({"id": 1}, "orders", headers={"n": 1})  # type: ignore[dict-item]
            with pytest.raises(sqlbroker.InvalidPriority):
                await app.publish({"id": 1}, "orders", priority=42)
            with pytest.raises(sqlbroker.InvalidName):
                await app.publish({"id": 1}, "orders..x")
        finally:
            await app.stop()

    asyncio.run(scenario())
    assert broker.pending("orders") == []
