"""Debounce and replace under least-privilege roles (docs/flow-control.md, "Debounce and
replace"; docs/security.md): replacing deletes a pending copy and updates the new one, so
it takes the consumer group's rights besides the producer's (a typical worker process
holds both); a producer-only login is refused with a sqlbroker error and writes nothing."""

from __future__ import annotations

import pytest

from .test_roles import LOGINS, WORKER, SecuredDatabase, _refused, db  # noqa: F401

pytestmark = pytest.mark.postgres


def test_a_worker_login_replaces_and_a_producer_alone_is_refused(db: SecuredDatabase) -> None:  # noqa: F811
    with db.broker(WORKER) as worker:
        worker.send("sync", {"v": 1}, key="doc", replace=True)
        last = worker.send("sync", {"v": 2}, key="doc", debounce=60)
        assert [m.message_id for m in worker.pending("sync")] == [last]
    with db.broker(LOGINS["producer"]) as producer:
        producer.send("sync", {"v": 0}, key="other")
        error = _refused(lambda: producer.send("sync", {"v": 3}, key="doc", replace=True))
        assert "permission" in str(error).lower()
    with db.broker(WORKER) as worker:
        assert [m.message_id for m in worker.pending("sync") if m.key == "doc"] == [last]
