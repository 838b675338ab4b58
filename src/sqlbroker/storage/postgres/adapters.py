"""How sqlbroker's PostgreSQL connections load values: psycopg's adapters, except for
timestamps that Python cannot hold."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap, Loader

from sqlbroker.storage.columns import NEGATIVE_INFINITY, POSITIVE_INFINITY

_TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
_DefaultTimestamptz = psycopg.adapters.get_loader(_TIMESTAMPTZ, psycopg.pq.Format.TEXT)


class _TimestamptzLoader(Loader):
    """timestamptz as psycopg loads it, except ``infinity`` and ``-infinity``, which
    Python's datetime cannot hold and psycopg refuses: one such value (sqlbroker never
    writes one; raw SQL can) would fail the whole statement reading it, a claim after it
    committed. They load as ``rows.POSITIVE_INFINITY``/``NEGATIVE_INFINITY``, which the row
    decoders treat as damage (docs/security.md, "Damaged rows")."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        assert _DefaultTimestamptz is not None
        self._load = _DefaultTimestamptz(oid, context).load

    def load(self, data: Any) -> Any:
        try:
            return self._load(data)
        except psycopg.DataError:
            text = bytes(data)
            if text == b"infinity":
                return POSITIVE_INFINITY
            if text == b"-infinity":
                return NEGATIVE_INFINITY
            raise


ADAPTERS = AdaptersMap(psycopg.adapters)
ADAPTERS.register_loader("timestamptz", _TimestamptzLoader)


class Strict:
    """An adapting context (psycopg's ``AdaptContext``) for a transformer that loads as
    ``conn`` does, except timestamptz by psycopg's own loader: it runs in C, with no Python
    call per value (a claimed row holds four), but refuses ``infinity`` with
    ``psycopg.DataError``. A reader using it loads a result that raises that again with
    ``conn``'s own adapters, which decode the rare damaged row."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.connection = conn
        self.adapters = AdaptersMap(conn.adapters)
        assert _DefaultTimestamptz is not None
        self.adapters.register_loader(_TIMESTAMPTZ, _DefaultTimestamptz)
