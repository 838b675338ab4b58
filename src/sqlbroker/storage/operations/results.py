"""Stored results: every trace of a message's copies, and the retention trim (see
:mod:`sqlbroker.features.results`). Values are written by ``message_settle_many``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlbroker.core.results import ResultRecord
from sqlbroker.storage.columns import utc
from sqlbroker.storage.plan import Plan, changed_count, query, reads

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


def _record(row: Any) -> ResultRecord:
    return ResultRecord(
        subscription=row[0],
        kind=row[1],
        value=None if row[2] is None else bytes(row[2]),
        reason=row[3],
        error_type=row[4],
        error_message=row[5],
        traceback=row[6],
        finished_at=None if row[7] is None else utc(row[7]),
    )


@reads
def result_lookup(settings: Settings, *, message_id: str) -> Plan[list[ResultRecord]]:
    """One row per trace of each copy: pending, a stored value, a dead letter, an archive
    row; the caller picks what each copy's result is."""
    rows = yield query("result_lookup", message_id=message_id)
    return [_record(row) for row in rows]


def result_trim(settings: Settings, *, ttl: float, limit: int) -> Plan[int]:
    """Delete up to ``limit`` results older than ``ttl`` seconds; return how many."""
    return changed_count("result_trim", ttl=ttl, limit=limit)
