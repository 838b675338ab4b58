"""The caller's own connection (``conn=``): find the driver connection underneath.

A transactional publish writes through the connection the application already holds, so
the message commits or rolls back with the application's own writes. Applications hold
that connection in many wrappers; this module unwraps them to the driver connection
without importing any of the libraries (an object's type and attributes tell which it is):

- a driver connection as is: ``sqlite3.Connection``, ``psycopg.Connection``,
  ``psycopg.AsyncConnection``;
- SQLAlchemy ``Connection`` and ``Session`` (and their asyncio twins): their DBAPI
  connection, after beginning SQLAlchemy's transaction when none is open yet — as any
  statement of theirs would — so that the caller's ``commit()`` commits our rows too;
- Django's ``connection`` (or ``connections[alias]``): the connection it wraps, opened if
  need be; outside ``transaction.atomic()`` Django runs in autocommit and so does the publish.

:data:`CallerConnection` names these kinds once, for every ``conn=`` parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import sqlite3

    import psycopg
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.utils.connection import ConnectionProxy
    from sqlalchemy.engine import Connection as SQLAlchemyConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SQLAlchemyAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session

    CallerConnection: TypeAlias = (
        sqlite3.Connection
        | psycopg.Connection[Any]
        | psycopg.AsyncConnection[Any]
        | SQLAlchemyConnection
        | Session
        | scoped_session[Any]
        | SQLAlchemyAsyncConnection
        | AsyncSession
        | async_scoped_session[Any]
        | BaseDatabaseWrapper
        | ConnectionProxy
    )
    """A caller's own connection (``conn=``), whose transaction an operation joins: one
    of the kinds listed above. The optional libraries are named for type checkers only;
    none is imported at run time."""
else:
    CallerConnection = object


def _module(conn: object) -> str:
    return type(conn).__module__ or ""


def _is_sqlalchemy_session(conn: object) -> bool:
    return _module(conn).startswith("sqlalchemy.orm") and callable(
        getattr(conn, "connection", None)
    )


def _is_sqlalchemy_connection(conn: object) -> bool:
    return _module(conn).startswith("sqlalchemy.engine") and hasattr(conn, "in_transaction")


def _is_django(conn: object) -> bool:
    return _module(conn).startswith("django.") and hasattr(conn, "ensure_connection")


def is_async(conn: object) -> bool:
    """Whether ``conn`` needs awaiting: psycopg's ``AsyncConnection`` or SQLAlchemy's
    asyncio ``AsyncConnection`` / ``AsyncSession``."""
    module = _module(conn)
    if module.startswith("sqlalchemy.ext.asyncio"):
        return True
    return module.startswith("psycopg") and type(conn).__name__ == "AsyncConnection"


def unwrap(conn: Any) -> Any:
    """The driver connection behind a synchronous ``conn``."""
    if _is_sqlalchemy_session(conn):
        conn = conn.connection()
    if _is_sqlalchemy_connection(conn):
        if not conn.in_transaction():
            conn.begin()
        return conn.connection.driver_connection
    if _is_django(conn):
        conn.ensure_connection()
        return conn.connection
    return conn


async def unwrap_async(conn: Any) -> Any:
    """The driver connection behind an asynchronous ``conn`` (see :func:`is_async`)."""
    module = _module(conn)
    if module.startswith("sqlalchemy.ext.asyncio"):
        if type(conn).__name__ in ("AsyncSession", "async_scoped_session"):
            conn = await conn.connection()
        if not conn.in_transaction():
            await conn.begin()
        raw = await conn.get_raw_connection()
        return raw.driver_connection
    return conn


def describe(conn: object) -> str:
    kind = type(conn)
    return f"{kind.__module__}.{kind.__qualname__}"
