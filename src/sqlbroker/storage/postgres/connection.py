"""PostgreSQL connections: the pool, transactions and error translation."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from sqlbroker.core.errors import ConnectionLost, InvalidOption, SchemaError, StorageError
from sqlbroker.storage.url import DatabaseURL, redact

Conn = psycopg.Connection[TupleRow]


class PostgresPool:
    """Autocommit connections from a ``psycopg_pool`` pool, opened on first use.

    Every driver error leaving :meth:`connection` or :meth:`transaction` is translated:
    a broken connection becomes ``ConnectionLost`` (``ambiguous`` for writes, whose commit
    may or may not have happened), a missing table ``SchemaError``, anything else
    ``StorageError``; passwords are redacted from every message.
    """

    def __init__(
        self,
        url: DatabaseURL,
        *,
        pool_size: int,
        synchronous_commit: str,
        connect_timeout: float,
        application_name: str,
    ) -> None:
        if not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
            raise InvalidOption("pool_size", "must be an integer from 1 to 1000")
        if synchronous_commit not in ("on", "off", "local", "remote_write", "remote_apply"):
            raise InvalidOption(
                "synchronous_commit", "must be on, off, local, remote_write or remote_apply"
            )
        if not isinstance(connect_timeout, int | float) or not 0 < connect_timeout <= 600:
            raise InvalidOption("connect_timeout", "must be seconds, more than 0 and at most 600")
        self.url = url
        self._pool_size = pool_size
        self._connect_timeout = float(connect_timeout)
        self._settings = {
            "synchronous_commit": synchronous_commit,
            "application_name": application_name,
        }
        self._pool: ConnectionPool[Conn] | None = None
        self._pool_lock = threading.Lock()
        self._closed = False

    def connection_kwargs(self) -> dict[str, Any]:
        """Settings for any connection sqlbroker opens (the pool and the listener)."""
        return {
            "autocommit": True,
            "connect_timeout": max(1, int(self._connect_timeout)),
            "application_name": self._settings["application_name"],
            "options": f"-c synchronous_commit={self._settings['synchronous_commit']}",
        }

    @property
    def conninfo(self) -> str:
        return self.url.raw

    def _open_pool(self) -> ConnectionPool[Conn]:
        with self._pool_lock:
            if self._closed:
                raise StorageError("the broker is closed")
            if self._pool is None:
                # One direct connection first: it fails fast with the server's own reason
                # (wrong password, no such database), which a pool would only log.
                try:
                    psycopg.connect(self.url.raw, **self.connection_kwargs()).close()
                except psycopg.Error as error:
                    raise ConnectionLost(
                        f"cannot connect to PostgreSQL at {self.url}: {redact(str(error)).strip()}",
                        ambiguous=False,
                    ) from None
                self._pool = ConnectionPool(
                    self.url.raw,
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs=self.connection_kwargs(),
                    timeout=self._connect_timeout,
                    name="sqlbroker",
                    open=True,
                )
            return self._pool

    @contextmanager
    def connection(self, *, write: bool) -> Iterator[Conn]:
        pool = self._pool if self._pool is not None else self._open_pool()
        try:
            with pool.connection() as conn:
                try:
                    yield conn
                except psycopg.Error as error:
                    raise self.translate(error, write=write, conn=conn) from None
        except PoolTimeout:
            raise ConnectionLost(
                f"no PostgreSQL connection within {self._connect_timeout:g} s"
                f" (pool of {self._pool_size})",
                ambiguous=False,
            ) from None
        except psycopg.OperationalError as error:
            raise ConnectionLost(
                f"PostgreSQL connection failed: {redact(str(error)).strip()}", ambiguous=False
            ) from None

    def translate(self, error: psycopg.Error, *, write: bool, conn: Conn | None) -> Exception:
        text = (
            redact(str(error)).strip().splitlines()[0]
            if str(error).strip()
            else type(error).__name__
        )
        if isinstance(error, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
            return SchemaError(
                f"the sqlbroker schema is missing or old ({text}); run `sqlbroker migrate`"
            )
        if isinstance(error, psycopg.errors.InsufficientPrivilege):
            return StorageError(f"PostgreSQL refused: {text}")
        broken = (
            conn is None
            or conn.broken
            or isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
        )
        if broken and not isinstance(error, psycopg.errors.QueryCanceled):
            return ConnectionLost(f"lost the PostgreSQL connection: {text}", ambiguous=write)
        return StorageError(f"PostgreSQL error: {text}")

    @contextmanager
    def transaction(self, conn: Any = None) -> Iterator[Conn]:
        """A transaction on a pooled connection, or the caller's connection as it stands
        (the caller owns its transaction; we never commit or roll it back)."""
        if conn is not None:
            if not isinstance(conn, psycopg.Connection):
                raise InvalidOption(
                    "conn",
                    f"a PostgreSQL broker needs a psycopg.Connection, not {type(conn).__name__}",
                )
            try:
                yield conn
            except psycopg.Error as error:
                raise self.translate(error, write=True, conn=conn) from None
            return
        with self.connection(write=True) as own, own.transaction():
            yield own

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
