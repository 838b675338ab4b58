"""A server crash right after a claim forgets at most the lease (PostgreSQL).

A claim commits without waiting for the WAL flush unless ``durable_claims=True``
(``tests/conformance/test_claim_commit.py``). Here the server of the test's own, durable
(``fsync`` on), is killed with ``pg_ctl restart -m immediate`` right after a claim of 20
copies. Each copy must come back either leased, as the claim left it, or available with
the attempt uncounted — never anything else — and every one must then complete. With
``durable_claims=True`` every lease must survive.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import sqlbroker
from reliability.pgfaults import OwnServer, scalar

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

COPIES = 20
LEASE = 1.0


@pytest.fixture
def own_server() -> Iterator[OwnServer]:
    server = OwnServer()
    yield server
    server.stop()


def states(url: str) -> list[tuple[str, int]]:
    return [
        (str(state), int(attempts))
        for state, attempts in scalar(
            url,
            "SELECT coalesce(json_agg(json_build_array(state, attempts)), '[]')"
            " FROM sqlbroker_message",
        )
    ]


@pytest.mark.parametrize("durable", [False, True], ids=["default", "durable_claims"])
def test_a_crash_after_a_claim_loses_no_message(own_server: OwnServer, durable: bool) -> None:
    url = own_server.start()
    with sqlbroker.Broker(url, durable_claims=durable) as broker:
        sent = set(broker.send_many("q", [{"i": i} for i in range(COPIES)]))
        claimed = broker.claim("q", limit=COPIES, lease=LEASE)
        assert len(claimed) == COPIES
    own_server.restart()

    after = states(url)
    assert len(after) == COPIES
    assert set(after) <= {("running", 1), ("available", 0)}, after
    if durable:
        assert set(after) == {("running", 1)}

    with sqlbroker.Broker(url) as broker:
        done: set[str] = set()
        deadline = time.monotonic() + 30 * LEASE
        while len(done) < COPIES and time.monotonic() < deadline:
            broker.reap()  # leases from before the crash run out after LEASE seconds
            deliveries = broker.claim("q", limit=COPIES, lease=30.0)
            broker.complete(deliveries)
            done.update(d.message_id for d in deliveries)
            time.sleep(0 if deliveries else 0.1)
        assert done == sent
    assert scalar(url, "SELECT count(*) FROM sqlbroker_message") == 0
    assert (
        scalar(url, "SELECT count(*) FROM sqlbroker_archive WHERE outcome = 'completed'") == COPIES
    )
