"""The Kombu transport of sqlbroker.contrib.celery, in this process, on both backends: what a
Celery producer writes, what a consumer gets, and how acks, rejects and restores land in
sqlbroker. Real ``celery worker`` processes are in test_celery_workers.py."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

import sqlbroker
from sqlbroker.contrib.celery import SCHEME, publishing_in, queue_name
from sqlbroker.core.topics import validate_topic

SRC = Path(__file__).resolve().parents[2] / "src"


def _app(url: str, **options: Any) -> Celery:
    app = Celery("shop", broker=f"{SCHEME}+{url}", set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 30, **options}

    @app.task(name="shop.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return app


@pytest.fixture
def app(broker: sqlbroker.Broker, backend_url: str) -> Iterator[Celery]:
    made = _app(backend_url)
    yield made
    made.close()


def _take(app: Celery, count: int) -> tuple[list[Any], Any, Any]:
    """``count`` messages of the ``celery`` queue, as a Celery worker receives them, left
    unacknowledged (the caller acks or rejects them, then closes the connection)."""
    conn = app.connection_for_read()
    queue = conn.SimpleQueue("celery", no_ack=False)
    return [queue.get(timeout=10) for _ in range(count)], conn, queue


def test_a_task_is_one_sqlbroker_message_and_its_ack_completes_it(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    result = app.tasks["shop.add"].delay(2, 3)
    (pending,) = broker.pending("celery")
    assert pending.state.value == "available"

    (message,), conn, queue = _take(app, 1)
    assert message.headers["task"] == "shop.add"
    assert message.headers["id"] == result.id
    assert message.decode()[0] == [2, 3]
    message.ack()
    queue.close()
    conn.close()

    (done,) = broker.archive("celery", outcome="completed")
    assert done.message_id == pending.message_id
    assert broker.pending("celery") == []


def test_priorities_keep_their_celery_on_redis_meaning_0_first(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    add = app.tasks["shop.add"]
    for priority in (5, 9, 0, 3):
        add.apply_async((priority, 0), priority=priority)
    messages, conn, queue = _take(app, 4)
    assert [m.decode()[0][0] for m in messages] == [0, 3, 5, 9]
    for message in messages:
        message.ack()
    queue.close()
    conn.close()
    assert len(broker.archive("celery", outcome="completed")) == 4


def test_a_countdown_waits_in_the_database_not_in_a_worker(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    app.tasks["shop.add"].apply_async((1, 1), countdown=3600)
    (waiting,) = broker.pending("celery")
    assert waiting.state.value == "scheduled", "the ETA is the message's availability time"
    assert broker.claim("celery") == [], "no worker can take it before its ETA"


def test_unacknowledged_messages_come_back_when_the_connection_closes(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    app.tasks["shop.add"].delay(1, 2)
    (_held,), conn, queue = _take(app, 1)
    assert broker.claim("celery") == [], "leased while Celery holds it"
    queue.close()
    conn.close()
    (again,) = broker.claim("celery")
    assert again.attempt == 1, "released, not retried: the attempt is not counted"


def test_reject_requeue_counts_an_attempt_and_reject_dead_letters(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    add = app.tasks["shop.add"]
    add.delay(1, 0)
    add.delay(2, 0)
    (first, second), conn, queue = _take(app, 2)
    first.reject(requeue=True)
    second.reject()
    queue.close()
    conn.close()
    (retried,) = broker.claim("celery")
    assert retried.attempt == 2
    assert retried.payload["headers"]["id"] == first.headers["id"]
    (dead,) = broker.dead_letters.list(subscription="celery")
    assert dead.reason == "rejected by Celery"


def test_a_redelivered_message_says_so(app: Celery, broker: sqlbroker.Broker) -> None:
    app.tasks["shop.add"].delay(1, 0)
    (message,), conn, queue = _take(app, 1)
    assert message.delivery_info["redelivered"] is False
    message.reject(requeue=True)
    again = queue.get(timeout=10)
    assert again.delivery_info["redelivered"] is True
    assert again.delivery_tag != message.delivery_tag, "each claim has its own lease token"
    again.ack()
    queue.close()
    conn.close()
    assert len(broker.archive("celery", outcome="completed")) == 1


def test_queue_names_sqlbroker_refuses_are_carried_under_a_stable_name(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    odd = "celery@host.example:reply"
    assert queue_name("celery") == "celery"
    assert queue_name(odd) == queue_name(odd) != odd
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(odd)
        queue.put({"n": 1})
        assert queue.get(timeout=10).payload == {"n": 1}
        queue.close()
    assert [s.name for s in broker.subscriptions()] == [queue_name(odd)]


def test_queue_name_keeps_exactly_the_names_sqlbroker_accepts() -> None:
    """A Kombu queue keeps its name when sqlbroker takes it as a queue name (core's rule,
    not a copy of it), and only then."""
    longest = ".".join(["s" * 64] * 3 + ["t" * 60])  # 255 characters
    for name in ("celery", "a.b-c_d", "x" * 64, longest):
        assert queue_name(name) == validate_topic(name) == name
    for name in ("x" * 65, longest + "u", "a..b", ".a", "a.", "é", "a b", "a@b", ""):
        with pytest.raises(sqlbroker.InvalidName):
            validate_topic(name)
        assert queue_name(name).startswith("kombu.")


def test_purge_cancels_the_ready_messages(app: Celery, broker: sqlbroker.Broker) -> None:
    for n in range(3):
        app.tasks["shop.add"].delay(n, 0)
    assert app.control.purge() == 3
    assert broker.pending("celery") == []
    assert len(broker.archive("celery", outcome="cancelled")) == 3


def test_tasks_sent_in_the_callers_transaction_exist_only_if_it_commits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shop.db"
    with sqlbroker.Broker(f"sqlite:///{path}", migrate=True) as broker:
        app = _app(f"sqlite:///{path}")
        add = app.tasks["shop.add"]
        with sqlite3.connect(path, isolation_level=None) as db:
            db.execute("CREATE TABLE orders (id INTEGER)")
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO orders VALUES (1)")
            with publishing_in(db):
                add.delay(1, 1)
            db.execute("ROLLBACK")
            assert broker.pending("celery") == [], "rolled back with the order"
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO orders VALUES (2)")
            with publishing_in(db):
                add.delay(2, 2)
            db.execute("COMMIT")
        (sent,) = broker.pending("celery")
        assert sent.state.value == "available"
        app.close()


def test_an_unknown_database_is_one_clear_error(tmp_path: Path) -> None:
    with Connection("sqlbroker+mysql://app@db/app") as conn, pytest.raises(sqlbroker.InvalidURL):
        conn.connect()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"visibilty_timeout": 5}, "visibilty_timeout"),
        ({"visibility_timeout": -1}, "visibility_timeout"),
        ({"claim_batch": 0}, "claim_batch"),
        ({"broker_options": {"pool_sise": 2}}, "pool_sise"),
        ({"broker_options": {"lease": 2}}, "broker_options"),
    ],
)
def test_a_bad_transport_option_is_one_clear_error(
    backend_url: str, options: dict[str, Any], named: str
) -> None:
    conn = Connection(f"sqlbroker+{backend_url}", transport_options=options)
    with pytest.raises(sqlbroker.ValidationError, match=named):
        conn.connect()


def test_a_missing_celery_extra_is_one_clear_error() -> None:
    """Without Kombu installed (hidden here), importing the adapter says which extra to
    install, not a bare ModuleNotFoundError."""
    script = (
        "import sys; sys.modules['kombu'] = None\n"
        "try:\n"
        "    import sqlbroker.contrib.celery\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.startswith("ConfigurationError"), done.stdout + done.stderr
    assert "pip install 'sqlbroker[celery]'" in done.stdout


def test_broker_transport_names_it_without_an_import(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """``broker_transport`` set to the class path, with the plain database URL, needs no
    ``import sqlbroker.contrib.celery`` (Kombu imports it by path)."""
    app = Celery("plain", broker=backend_url, set_as_current=False)
    app.conf.broker_transport = "sqlbroker.contrib.celery:Transport"
    app.send_task("shop.add", (1, 2))
    (sent,) = broker.pending("celery")
    assert sent.state.value == "available"
    app.close()


def test_a_task_requeued_until_its_attempts_are_spent_is_dead_lettered(
    broker: sqlbroker.Broker, backend_url: str
) -> None:
    """``reject(requeue=True)`` counts an attempt: a task that fails every worker ends in
    the dead letters after ``max_attempts`` instead of looping."""
    app = _app(backend_url, max_attempts=2)
    app.tasks["shop.add"].delay(1, 1)
    conn = app.connection_for_read()
    queue = conn.SimpleQueue("celery", no_ack=False)
    queue.get(timeout=10).reject(requeue=True)
    queue.get(timeout=10).reject(requeue=True)
    queue.close()
    conn.close()
    app.close()
    (dead,) = broker.dead_letters.list(subscription="celery")
    assert "max attempts" in dead.reason
    assert broker.pending("celery") == []


def test_concurrent_sends_each_commit_once_and_a_bad_one_fails_alone(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    """Eight threads publish at once (their sends share commits): every task is there once,
    and the one too large for the payload limit raises for its own caller only."""
    add = app.tasks["shop.add"]
    start = threading.Barrier(8)
    failures: list[BaseException] = []

    def publish(thread: int) -> None:
        start.wait()
        for n in range(25):
            try:
                add.delay(thread, "x" * 300_000 if (thread, n) == (3, 7) else n)
            except sqlbroker.InvalidPayload as error:
                failures.append(error)

    threads = [threading.Thread(target=publish, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(failures) == 1
    sent = broker.pending("celery", limit=1000)
    assert len(sent) == 8 * 25 - 1
    assert len({m.message_id for m in sent}) == len(sent)


def test_concurrent_sends_gather_into_commits_of_them_all(
    app: Celery, broker: sqlbroker.Broker
) -> None:
    """Eight threads publishing in a loop share commits of (nearly) all eight: a leader
    waits for the threads the previous commit released, instead of the threads splitting
    into two groups taking turns (commits of four)."""
    add = app.tasks["shop.add"]
    add.delay(0, 0)  # connect first
    with app.connection_for_write() as connection:
        sender = connection.transport.sender
    before = sender.batches
    start = threading.Barrier(8)

    def publish(thread: int) -> None:
        start.wait()
        for n in range(40):
            add.delay(thread, n)

    threads = [threading.Thread(target=publish, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(broker.pending("celery", limit=1000)) == 1 + 8 * 40
    assert 8 * 40 / (sender.batches - before) >= 5.5, "the mean commit carries most threads"


def test_a_full_disk_is_retried_by_kombu_until_space_is_freed(tmp_path: Path) -> None:
    """``StorageFull`` is one of the transport's connection errors, which Kombu retries
    with its backoff (a publish with ``retry=True``, a worker's consumer restarting): the
    send waits out the full disk and lands once the space is freed, instead of failing."""
    from reliability.fulldisk import fill, tmpfs

    with tmpfs(tmp_path / "disk", size_mb=16) as directory:
        url = f"sqlite:///{directory / 'broker.db'}"
        sqlbroker.Broker(url).close()
        app = _app(url)
        failures: list[BaseException] = []
        freed = threading.Event()

        def on_error(error: BaseException, interval: float) -> None:
            failures.append(error)
            if not freed.is_set():
                (directory / "filler").unlink()
                freed.set()

        try:
            fill(directory / "filler", leave=0)
            app.send_task(
                "shop.add",
                (1, 2),
                retry=True,
                retry_policy={
                    "max_retries": 5,
                    "interval_start": 0,
                    "interval_step": 0.1,
                    "errback": on_error,
                },
            )
            assert freed.is_set()
            assert isinstance(failures[0], sqlbroker.StorageFull), failures
            with sqlbroker.Broker(url) as broker:
                (sent,) = broker.pending("celery")
                assert sent.state.value == "available"
        finally:
            app.close()
