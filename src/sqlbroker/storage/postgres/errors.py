"""What a PostgreSQL failure means to a caller: the sqlbroker error each driver error
becomes (a raw driver exception never leaves storage)."""

from __future__ import annotations

import psycopg
import psycopg.errors
from psycopg.rows import TupleRow

from sqlbroker.core.errors import (
    AuthenticationError,
    ConfigurationError,
    ConnectionLost,
    DatabaseBusy,
    SchemaError,
    StorageError,
    StorageFull,
    undone,
)
from sqlbroker.storage.plan import StatementFailed
from sqlbroker.storage.postgres.options import SessionOptions
from sqlbroker.storage.url import redact

Conn = psycopg.Connection[TupleRow]
AsyncConn = psycopg.AsyncConnection[TupleRow]

# A failed connection attempt carries no SQLSTATE (libpq reports it as text), so a refused
# login is told from an unreachable server by the server's message.
_LOGIN_REFUSED = (
    "password authentication failed",
    "authentication failed for user",
    "no pg_hba.conf entry",
    "no password supplied",
    "password is required",
)
_ROLE = 'role "'
_NO_SUCH_DATABASE = 'database "'
_NO_SPACE = "no space left on device"  # strerror(ENOSPC), in any error's text


def connect_failure(context: str, error: psycopg.Error, *, write: bool = True) -> Exception:
    """The error for a connection that could not be opened (nothing was sent, so nothing
    was applied): a refused login is an :class:`AuthenticationError`, a missing database
    or an unusable connection string a :class:`ConfigurationError` — neither is transient
    and neither is retried — and anything else (server down, network) ``ConnectionLost``."""
    text = " ".join(redact(str(error)).split())
    lowered = text.lower()
    refused = any(marker in lowered for marker in _LOGIN_REFUSED) or (
        _ROLE in lowered and ("does not exist" in lowered or "not permitted to log in" in lowered)
    )
    if refused:
        return AuthenticationError(f"{context}: the server refused the login: {text}")
    if _NO_SUCH_DATABASE in lowered and "does not exist" in lowered:
        return ConfigurationError(f"{context}: {text}")
    if "unsupported startup parameter" in lowered:  # a pooler refusing our session settings
        return ConfigurationError(
            f"{context}: {text} (behind a transaction pooler such as PgBouncer, pass"
            " pooler='transaction'; see docs/reliability.md)"
        )
    if isinstance(error, psycopg.ProgrammingError):  # an invalid connection option
        return ConfigurationError(f"{context}: {text}")
    return ConnectionLost(f"{context}: {text}", ambiguous=False, write=write)


_ROLLED_BACK: dict[type[psycopg.Error], str] = {
    psycopg.errors.DeadlockDetected: "a deadlock with another session (SQLSTATE 40P01)",
    psycopg.errors.SerializationFailure: (
        "a serialization failure: a concurrent transaction changed what this one read or"
        " wrote (SQLSTATE 40001)"
    ),
}
"""Of SQLSTATE class 40 (psycopg files it under ``OperationalError``), the errors whose
outcome is known: the server rolled the transaction back and the session goes on. Not
40003 (statement completion unknown)."""


def _disk_full(error: psycopg.Error, text: str) -> bool:
    """Whether the server refused a statement for want of disk space (SQLSTATE 53100, or
    ENOSPC in the words of an error filed under another code). A PANIC or FATAL one ended
    the session too (the server could not write its WAL and restarts): that is a lost
    connection, whose commit's fate is unknown, not a refused statement."""
    if error.diag.severity_nonlocalized in ("PANIC", "FATAL"):
        return False
    return isinstance(error, psycopg.errors.DiskFull) or _NO_SPACE in text.lower()


def translate(
    error: psycopg.Error | StatementFailed,
    options: SessionOptions,
    *,
    write: bool,
    conn: Conn | AsyncConn | None,
) -> Exception:
    """The sqlbroker error for a driver error of an open connection: a broken connection
    is ``ConnectionLost`` (``ambiguous`` for writes, whose commit may or may not have
    happened), a missing table ``SchemaError``, a lock or statement timeout, a deadlock or
    a serialization failure ``DatabaseBusy``, anything else ``StorageError``; passwords
    are redacted. A statement of a write run alone (:class:`StatementFailed`) after
    others of its operation committed does not claim that nothing was changed; a read's
    earlier statements changed nothing."""
    committed = isinstance(error, StatementFailed) and error.committed and write
    if isinstance(error, StatementFailed):
        assert isinstance(error.error, psycopg.Error)
        error = error.error
    text = (
        redact(str(error)).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    )
    left = undone(committed, "nothing was changed, try again")
    if isinstance(error, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        return SchemaError(
            f"the sqlbroker schema is missing or old ({text}); run `sqlbroker migrate`"
        )
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        return StorageError(
            f"PostgreSQL refused: {text} (the connecting role lacks this right; the roles"
            " and their grants are in docs/security.md)"
        )
    if isinstance(error, psycopg.errors.LockNotAvailable):
        return DatabaseBusy(
            f"PostgreSQL: a lock was held by another session longer than lock_timeout"
            f" ({options.lock_timeout:g} s); {left}: {text}"
        )
    rolled_back = _ROLLED_BACK.get(type(error))
    if rolled_back is not None and not (conn is not None and conn.broken):
        return DatabaseBusy(
            f"PostgreSQL: {rolled_back}; the server rolled the transaction back, so {left}: {text}"
        )
    if isinstance(error, psycopg.errors.QueryCanceled) and "statement timeout" in text:
        return DatabaseBusy(
            f"PostgreSQL: the statement ran longer than statement_timeout"
            f" ({options.statement_timeout:g} s); {left}: {text}"
        )
    if _disk_full(error, text) and not (conn is not None and conn.broken):
        return StorageFull("PostgreSQL", text, committed=committed)
    broken = (
        conn is None
        or conn.broken
        or isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
    )
    if broken and not isinstance(error, psycopg.errors.QueryCanceled):
        return ConnectionLost(
            f"lost the PostgreSQL connection: {text}", ambiguous=write, write=write
        )
    return StorageError(f"PostgreSQL error: {text}")
