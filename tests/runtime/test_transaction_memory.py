"""``msg.transaction()`` on an in-memory SQLite broker: the transaction's connection is the
pool's own (the only one a ``:memory:`` database has), so completing the message inside it
must be allowed, for plain-function and coroutine handlers alike."""

from __future__ import annotations

from typing import Any

import pytest

import sqlbroker
from runtime.support import run_until_idle


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_transaction_on_an_in_memory_broker(kind: str) -> None:
    with sqlbroker.Broker("sqlite:///:memory:") as broker:
        with broker.backend.begin() as tx:
            tx.connection.execute("CREATE TABLE app_effects (message_id text, attempt integer)")
        retry = sqlbroker.RetryPolicy(base=0.01, cap=0.01)

        def write(conn: Any, msg: sqlbroker.Message) -> None:
            conn.execute("INSERT INTO app_effects VALUES (?, ?)", (msg.id, msg.attempt))
            if msg.attempt == 1 and msg.payload == "flaky":
                raise RuntimeError("after the write, before the commit")

        if kind == "sync":

            @broker.subscriber(queue="jobs", retry=retry)
            def handle(msg: sqlbroker.Message) -> None:
                with msg.transaction() as conn:
                    write(conn, msg)

        else:

            @broker.subscriber(queue="jobs", retry=retry)
            async def handle_async(msg: sqlbroker.Message) -> None:
                async with msg.transaction() as conn:
                    write(conn, msg)

        ids = {broker.send("jobs", payload): payload for payload in ["steady", "flaky"]}
        run_until_idle(broker)

        with broker.backend.begin() as tx:
            rows = sorted(tuple(r) for r in tx.connection.execute("SELECT * FROM app_effects"))
        assert rows == sorted(
            (message_id, 2 if payload == "flaky" else 1) for message_id, payload in ids.items()
        )
        assert broker.pending("jobs") == []
        assert broker.dead_letters.list() == []
        assert sorted(a.message_id for a in broker.archive("jobs")) == sorted(ids)
