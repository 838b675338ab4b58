"""A keyed publish racing the completion of its key's head (PostgreSQL, real threads): the
new copy must never be left blocked with no head until the reaper's key repair."""

from __future__ import annotations

import threading

import psycopg
import pytest

import sqlbroker

PUBLISHES = 1000

HEADS = """
SELECT count(*) FILTER (WHERE state <> 'blocked'), count(*)
FROM sqlbroker_message WHERE subscription = 'q' AND ordering_key = 'k'
"""


@pytest.mark.parametrize("batch", [1, 2], ids=["send", "send_many"])
def test_a_keyed_publish_racing_its_keys_completion_leaves_a_head(pg_url: str, batch: int) -> None:
    # One message takes the keyed queue statement, a batch the routed one. A worker thread
    # claims and completes the key's head as fast as it can while the main thread publishes
    # to the key: most publishes find the key with one copy, running, that may be leaving.
    # After each publish returns, with no completion half done (the lock), the key has
    # exactly one head whenever it has copies. reap() is never called.
    stop = threading.Event()
    settling = threading.Lock()
    completed: list[int] = []
    failures: list[BaseException] = []
    with sqlbroker.Broker(pg_url) as broker, psycopg.connect(pg_url, autocommit=True) as db:

        def work() -> None:
            try:
                while not stop.is_set():
                    got = broker.claim("q", limit=1)
                    if got:
                        with settling:
                            broker.complete(got)
                        completed.append(len(got))
            except BaseException as error:  # reported by the main thread
                failures.append(error)

        worker = threading.Thread(target=work)
        broker.send("q", {"n": -1}, key="k")
        worker.start()
        headless = []
        try:
            for n in range(PUBLISHES):
                if batch == 1:
                    broker.send("q", {"n": n}, key="k")
                else:
                    broker.send_many("q", [{"n": n}] * batch, key="k")
                with settling:
                    row = db.execute(HEADS).fetchone()
                assert row is not None
                heads, copies = row
                assert heads <= 1
                if copies and not heads:
                    headless.append(n)
        finally:
            stop.set()
            worker.join()
        assert not failures
        assert sum(completed) > 0
        assert headless == []


def test_a_keyed_publish_in_a_long_transaction_does_not_hold_up_the_heads_completion(
    pg_url: str,
) -> None:
    # The caller's transaction holds the key's lock until it commits. Completing the key's
    # head waits for it only briefly (the promotion's bounded barrier), and the copy the
    # transaction queued behind the head gets its turn from the reaper's key repair.
    with sqlbroker.Broker(pg_url) as broker, psycopg.connect(pg_url) as caller:
        broker.send("q", {"n": 0}, key="k")
        (head,) = broker.claim("q", limit=1)
        broker.send("q", {"n": 1}, key="k", conn=caller)  # blocked behind the head
        completed = threading.Event()
        worker = threading.Thread(target=lambda: (broker.complete([head]), completed.set()))
        worker.start()
        worker.join(timeout=60)
        finished_before_commit = completed.is_set()
        caller.commit()
        worker.join()
        assert finished_before_commit
        with psycopg.connect(pg_url, autocommit=True) as db:
            assert db.execute(HEADS).fetchone() == (0, 1)  # headless until the repair
        assert broker.reap()["unblocked"] == 1
        (nxt,) = broker.claim("q", limit=1)
        assert nxt.payload == {"n": 1}
        broker.complete([nxt])
