"""Network faults between a worker process and PostgreSQL (issue 25, part 2).

One worker reaches the server through ``faultproxy.FaultProxy``, another directly; a
producer publishes directly. The proxy's connections go silent without being closed
(half-open: a NAT's or load balancer's state dropped, the server's host gone), later
every connection is reset, then the proxy adds latency. The worker behind it must notice
its silent connections itself (``network_timeout``), replace them and work again, without
a restart; nothing acknowledged may be lost and every duplicate must have a reason.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import psycopg
import pytest

import sqlbroker
from reliability.checker import verdict_for
from reliability.faultproxy import FaultProxy
from reliability.history import HistoryWriter, read_histories
from reliability.pgfaults import (
    OwnServer,
    agents,
    completions,
    consumer,
    first_after,
    producer,
    wait_all,
    wait_drained,
)
from runtime.support import wait_until

pytestmark = pytest.mark.postgres

RATE = 40.0
LEASE = 3.0
NETWORK_TIMEOUT = 6.0  # the test's; the default is 30 s
SILENCE = 8.0  # longer than NETWORK_TIMEOUT, so the worker's statements time out


@pytest.fixture
def own_server() -> OwnServer:
    server = OwnServer()
    yield server
    server.stop()


def test_network_timeout_sets_libpq_keepalives_unless_the_url_does(
    own_server: OwnServer,
) -> None:
    """The defaults reach libpq; a value in the URL wins over them."""
    url = own_server.start()
    with sqlbroker.Broker(f"{url}?keepalives_idle=7", network_timeout=12) as broker:
        kwargs = broker.backend.connection_kwargs()
        with psycopg.connect(broker.backend.conninfo, **kwargs) as conn:
            params = conn.info.get_parameters()
    assert (kwargs["keepalives"], kwargs["keepalives_count"]) == ("1", "3")
    assert "keepalives_idle" not in kwargs
    assert params["keepalives_idle"] == "7"
    assert params["keepalives_interval"] == "2"
    assert params["tcp_user_timeout"] == "12000"
    with pytest.raises(sqlbroker.InvalidOption, match="network_timeout"):
        sqlbroker.Broker(url, network_timeout=0)


def test_own_statements_are_bounded_and_the_callers_transaction_is_not(pg_url: str) -> None:
    """A pooled connection that gives no answer within ``network_timeout`` is shut down:
    here a wait for a lock another session holds, which the watchdog cannot tell from a
    silent network. The caller's own transaction (``backend.begin(timed=False)``, a handler's
    effects) is never timed, however long it runs. (Without lock_timeout and
    statement_timeout, which otherwise fail the wait cleanly first: test_stuck_locks.py.)"""
    with sqlbroker.Broker(pg_url, network_timeout=1, lock_timeout=0, statement_timeout=0) as broker:
        broker.subscribe("held", ["held.#"])
        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT 1 FROM sqlbroker_subscription WHERE name = 'held' FOR UPDATE")
            with pytest.raises(sqlbroker.ConnectionLost, match="network_timeout") as raised:
                broker.unsubscribe("held")
            # Ambiguous indeed: the server still waits for the lock on behalf of a client
            # that left, and deletes the subscription once the holder commits.
            assert raised.value.ambiguous
        with broker.backend.begin(timed=False) as conn_tx:
            conn = conn_tx.connection
            conn.execute("SELECT pg_sleep(1.5)")
        broker.send("jobs", {"tag": "after"})  # the pool replaced its connections


def test_the_result_listen_session_finds_a_silent_network_and_listens_again(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The result LISTEN session (which ``broker.result(…, wait=…)`` waits on) is checked
    as the worker's is: on a network gone silent behind the proxy, where keepalives see
    nothing wrong, its health check gets no answer within half ``network_timeout``, so the
    session is shut down and replaced once the network is back, and a waiter hears hints
    again instead of waiting on a dead session for good."""
    caplog.set_level(logging.WARNING, logger="sqlbroker.storage")
    port = int(psycopg.conninfo.conninfo_to_dict(pg_url)["port"])
    proxy = FaultProxy(("127.0.0.1", port))
    try:
        behind = proxy.url_for(pg_url)
        with sqlbroker.Broker(behind, network_timeout=1, connect_timeout=2) as broker:
            hub = broker.backend.result_hub
            waiter = hub.register("m-1")
            try:
                waiter.ready()
                proxy.set_mode("silent")
                wait_until(
                    lambda: "result LISTEN connection failed (no answer from" in caplog.text,
                    timeout=30,
                    what="the silent session's health check to fail",
                )
                proxy.set_mode("pass")
                with psycopg.connect(pg_url, autocommit=True) as direct:
                    channel = broker.backend.result_channel

                    def heard() -> bool:
                        direct.execute("SELECT pg_notify(%s, 'm-1')", (channel,))
                        return waiter.wait(0.2)

                    wait_until(heard, timeout=30, what="a hint through a new session")
            finally:
                hub.unregister("m-1", waiter)
    finally:
        proxy.stop()


@pytest.mark.slow
def test_a_worker_behind_a_silent_then_reset_then_slow_network_recovers(
    own_server: OwnServer, tmp_path: Path
) -> None:
    url = own_server.start()
    proxy = FaultProxy(("127.0.0.1", own_server.server.port))
    faults = HistoryWriter(tmp_path, "faults")
    stop_file = tmp_path / "stop"
    try:
        with agents() as started:
            behind = consumer(
                proxy.url_for(url),
                tmp_path,
                "behind",
                lease=LEASE,
                sleep=0.02,
                network_timeout=NETWORK_TIMEOUT,
            )
            direct = consumer(url, tmp_path, "direct", lease=LEASE, sleep=0.02)
            started += [behind, direct]
            for agent in started:
                agent.wait_ready()
            publisher = producer(url, tmp_path, "producer", rate=RATE, stop_file=stop_file)
            started.append(publisher)
            publisher.wait_ready()
            time.sleep(3)
            faults.fault("silent", "network")
            proxy.set_mode("silent")
            time.sleep(SILENCE)
            proxy.set_mode("pass")
            silence_over = time.monotonic()
            faults.record("proxy_pass")
            time.sleep(2 * NETWORK_TIMEOUT + 3)
            faults.fault("reset", "network")
            proxy.set_mode("reset")
            time.sleep(0.5)
            proxy.set_mode("pass")
            reset_over = time.monotonic()
            time.sleep(4)
            faults.fault("latency", "network")
            proxy.latency = 0.05
            time.sleep(3)
            proxy.latency = 0.0
            time.sleep(1)
            stop_file.touch()
            wait_all([publisher], timeout=60)
            wait_drained(url, timeout=60)
            for agent in (behind, direct):
                assert agent.alive, agent.log()
                assert agent.stop() == 0, agent.log()
            # Its LISTEN session, silent too, was asked, found dead and replaced.
            assert "LISTEN connection lost (no answer from PostgreSQL" in behind.log(tail=10**7)
    finally:
        proxy.stop()

    events = read_histories(tmp_path)
    verdict = verdict_for(events, url, subscriptions=["jobs"], lease=LEASE)
    behind_done = completions([e for e in events if e["proc"] == "behind"])
    after_silence = first_after(behind_done, silence_over)
    after_reset = first_after(behind_done, reset_over)
    assert after_silence is not None, "the worker did not recover after the silence"
    assert after_reset is not None, "the worker did not recover after the reset"
    print(
        f"\nrecovered {after_silence - silence_over:.2f} s after the silence ended"
        f" ({SILENCE:g} s of silence, network_timeout {NETWORK_TIMEOUT:g} s),"
        f" {after_reset - reset_over:.2f} s after the reset\n{verdict.summary()}"
    )
    verdict.assert_clean()
    # Its silent statements time out network_timeout after they began (before the silence
    # ended); then the claim loop's backoff (at most 5 s) and a new connection.
    assert after_silence - silence_over <= 2 * NETWORK_TIMEOUT + 5
