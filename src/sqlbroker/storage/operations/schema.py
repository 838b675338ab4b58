"""The schema's version, read and recorded (the migrations themselves run in
``Backend.migrate``: see :mod:`sqlbroker.storage.schema`)."""

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


def schema_version_table(settings: Settings) -> Plan[int]:
    """A migration's first step: the versions table, made if missing, and the version it
    holds (0 when new)."""
    yield query("schema_version_table")
    (row,) = yield query("schema_version")
    return int(row[0])


def schema_version_record(settings: Settings, *, version: int, name: str) -> Plan[None]:
    """A migration's last step: the row of the version it brought the schema to."""
    yield query("schema_version_insert", version=version, name=name)
