"""The schema's version (the migrations themselves run in each backend's ``migrate``:
see :mod:`sqlbroker.storage.schema`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlbroker.storage.plan import Plan, query, reads

if TYPE_CHECKING:
    from sqlbroker.storage.seam import Settings


@reads
def schema_version(settings: Settings) -> Plan[int]:
    """The applied schema version (0 for an empty database, which has no versions table)."""
    (exists,) = yield query("schema_version_exists")
    if not exists[0]:
        return 0
    (row,) = yield query("schema_version")
    return int(row[0])
