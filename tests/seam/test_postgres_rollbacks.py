"""PostgreSQL: a statement the server rolls back — a deadlock, a serialization failure —
is ``DatabaseBusy`` (nothing was changed, try again), not a lost connection whose outcome
is unknown; the session goes on, and so does the pool."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from sqlbroker.core.clock import ManualClock
from sqlbroker.core.errors import ConnectionLost, DatabaseBusy
from sqlbroker.core.settlements import Lease
from sqlbroker.storage.factory import open_backend

from .support import claim, lock_waits, publish

LEASE = 30


def _admin_url(pg_server: Any, pg_url: str) -> str:
    return str(pg_server.url(psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]))


def test_a_deadlock_is_database_busy_and_the_pool_goes_on(pg_url: str, pg_server: Any) -> None:
    backend = open_backend(pg_url, lock_timeout=60, clock=ManualClock())
    try:
        publish(backend, "jobs", 2)
        first, second = (Lease.of(d) for d in claim(backend, "jobs", 2))
        failed: list[BaseException] = []

        def extend_second_then_first() -> None:
            try:
                with backend.begin() as tx:
                    tx.message_extend_leases(leases=[second], lease=LEASE)
                    tx.message_extend_leases(leases=[first], lease=LEASE)
            except BaseException as error:
                failed.append(error)

        with (
            psycopg.connect(_admin_url(pg_server, pg_url)) as other,
            psycopg.connect(_admin_url(pg_server, pg_url), autocommit=True) as admin,
        ):
            # Only the seam's session (deadlock_timeout 1 s) looks for the cycle: it is
            # the one the server rolls back.
            other.execute("SET deadlock_timeout = '1min'")
            other.execute("UPDATE sqlbroker_message SET priority = 1 WHERE id = %s", (first.id,))
            worker = threading.Thread(target=extend_second_then_first)
            worker.start()
            while lock_waits(admin) == 0:  # the seam's transaction waits for the first copy
                time.sleep(0.01)
            other.execute("UPDATE sqlbroker_message SET priority = 1 WHERE id = %s", (second.id,))
            worker.join()
            other.rollback()
        (error,) = failed
        assert isinstance(error, DatabaseBusy)
        assert not isinstance(error, ConnectionLost)
        assert "deadlock" in str(error)
        assert "nothing was changed" in str(error)
        assert sorted(backend.message_extend_leases(leases=[first, second], lease=LEASE)) == [
            first.id,
            second.id,
        ]
    finally:
        backend.close()


def test_a_serialization_failure_in_a_callers_transaction_is_database_busy(
    pg_url: str, pg_server: Any
) -> None:
    """A caller's REPEATABLE READ transaction extends a lease another session changed
    since its snapshot: PostgreSQL refuses it (40001). The caller's transaction is still
    usable (its savepoint was rolled back), and the backend's pool goes on."""
    backend = open_backend(pg_url, clock=ManualClock())
    try:
        publish(backend, "jobs", 1)
        (lease,) = (Lease.of(d) for d in claim(backend, "jobs", 1))
        with psycopg.connect(pg_url) as caller:
            caller.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            caller.execute("SELECT count(*) FROM sqlbroker_message")  # the snapshot
            # Changed since the caller's snapshot, by the backend's own session.
            assert list(backend.message_extend_leases(leases=[lease], lease=LEASE)) == [lease.id]
            with (
                pytest.raises(DatabaseBusy, match="serialization failure") as refused,
                backend.begin(conn=caller) as tx,
            ):
                tx.message_extend_leases(leases=[lease], lease=LEASE)
            assert not isinstance(refused.value, ConnectionLost)
            assert caller.execute("SELECT 1").fetchone() == (1,)
            caller.rollback()
        assert list(backend.message_extend_leases(leases=[lease], lease=LEASE)) == [lease.id]
    finally:
        backend.close()
