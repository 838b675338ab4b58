"""SQLite connections: a small pool, pragmas, write transactions and error translation."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from sqlbroker.core.errors import (
    ConfigurationError,
    DatabaseBusy,
    InvalidOption,
    SchemaError,
    SqlbrokerError,
    StorageError,
    StorageFull,
    undone,
)
from sqlbroker.core.topics import regex_matches, stored_pattern_matches
from sqlbroker.storage import caller
from sqlbroker.storage.caller import CallerConnection
from sqlbroker.storage.sql import load_blocks

_NETWORK_FILESYSTEMS = frozenset(
    [
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "gpfs",
        "fuse.s3fs",
        "fuse.rclone",
        "davfs",
        "fuse.gcsfuse",
    ]
)


def _filesystem_type(path: str) -> str | None:
    """The filesystem type that holds ``path`` according to /proc/mounts (Linux only)."""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            entries = [line.split() for line in mounts]
    except OSError:
        return None
    best, kind = "", None
    for fields in entries:
        if len(fields) < 3:
            continue
        mount_point = fields[1].replace("\\040", " ")
        prefix = mount_point.rstrip("/") + "/"
        if (path == mount_point or path.startswith(prefix)) and len(mount_point) >= len(best):
            best, kind = mount_point, fields[2]
    return kind


def _disk_full(error: sqlite3.Error) -> bool:
    """Whether SQLite ran out of disk: ``SQLITE_FULL`` (the database file or its WAL could
    not grow), or ``SQLITE_IOERR_SHMSIZE`` (the shared-memory file could not: SQLite writes
    into each of its new pages up front, so that a full disk is an error, not a SIGBUS)."""
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and (
        code & 0xFF == sqlite3.SQLITE_FULL or code == sqlite3.SQLITE_IOERR_SHMSIZE
    )


SESSION = load_blocks("sqlbroker.storage.sqlite", "session.sql")
"""The statements of a session (session.sql): pragmas, write transactions, savepoints."""
_SYNCHRONOUS = {
    "full": SESSION["session_synchronous_full"],
    "normal": SESSION["session_synchronous_normal"],
}
_SYNCHRONOUS_LEVEL = {"full": 2, "normal": 1}
"""The number ``PRAGMA synchronous`` reads back for each level."""

_WRITERS: dict[str, threading.RLock] = {}
_WRITERS_LOCK = threading.Lock()


def translate(
    error: sqlite3.Error, started: float, busy_timeout: float, *, committed: bool = False
) -> SqlbrokerError:
    """The sqlbroker error for ``error``, raised by a statement begun at ``started``
    (``time.monotonic()``) on a connection waiting up to ``busy_timeout`` for a lock;
    ``committed``: the operation's earlier statements had committed (see ``undone``)."""
    if not isinstance(error, sqlite3.OperationalError):
        return StorageError(f"SQLite error: {error}")
    text = str(error)
    if _disk_full(error):
        return StorageFull("SQLite", text, committed=committed)
    if "locked" in text or "busy" in text:
        waited = time.monotonic() - started
        # SQLite answers some conflicts at once, without waiting for the lock (its
        # busy handler gives up a step before the timeout, hence the half).
        how = (
            f"stayed locked for the whole busy timeout ({busy_timeout:g} s)"
            if waited >= busy_timeout / 2
            else f"was locked ({text} after {waited:.2f} s)"
        )
        return DatabaseBusy(
            f"the SQLite database {how}; {undone(committed, 'nothing was written')}"
        )
    if "no such table" in text:
        return SchemaError(f"the sqlbroker schema is missing ({text}); run `sqlbroker migrate`")
    return StorageError(f"SQLite error: {text}")


@contextmanager
def translated(busy_timeout: float) -> Iterator[None]:
    """SQLite's errors raised in the block as sqlbroker's (:func:`translate`)."""
    started = time.monotonic()
    try:
        yield
    except sqlite3.Error as error:
        raise translate(error, started, busy_timeout) from None


def _writer_for(path: str) -> threading.RLock:
    """One write lock per database file in this process, shared by every broker on it."""
    if path == ":memory:":
        return threading.RLock()
    with _WRITERS_LOCK:
        return _WRITERS.setdefault(path, threading.RLock())


class _PooledConnection(sqlite3.Connection):
    """A connection a :class:`SqlitePool` opened, marked with its pool's token: the pool's
    own connection handed out by a transaction may come back as a ``conn=`` (a handler's
    ``msg.transaction()`` completes its message in it), even on ``:memory:``."""

    pool_token: object = None


class SqlitePool:
    """Hands out connections to one database file, one thread at a time.

    Every connection runs in autocommit mode (``isolation_level=None``) with WAL,
    ``busy_timeout`` and the configured ``synchronous`` level; :meth:`write` wraps a block
    in ``BEGIN IMMEDIATE`` … ``COMMIT``.
    """

    def __init__(self, path: str, *, synchronous: str, busy_timeout: float, pool_size: int) -> None:
        if synchronous not in ("full", "normal"):
            raise InvalidOption("synchronous", f"must be 'full' or 'normal', not {synchronous!r}")
        if not isinstance(busy_timeout, int | float) or not 0 < busy_timeout <= 3600:
            raise InvalidOption("busy_timeout", "must be seconds, more than 0 and at most 3600")
        if not isinstance(pool_size, int) or not 1 <= pool_size <= 256:
            raise InvalidOption("pool_size", "must be an integer from 1 to 256")
        # Not printable: a control character or NUL, or a lone surrogate (no UTF-8 name).
        if not path.isprintable():
            raise InvalidOption("url", "the SQLite path must be printable UTF-8 text")
        self.memory = path == ":memory:"
        self._synchronous = synchronous
        self._busy_timeout = float(busy_timeout)
        if self.memory:
            self.path = ":memory:"
            pool_size = 1  # every connection to :memory: would be a different database
        else:
            self.path = os.path.abspath(os.path.expanduser(path))
            directory = os.path.dirname(self.path)
            if not os.path.isdir(directory):
                raise ConfigurationError(
                    f"the directory for the SQLite database does not exist: {directory}"
                )
            kind = _filesystem_type(directory)
            if kind in _NETWORK_FILESYSTEMS:
                raise ConfigurationError(
                    f"refusing a SQLite database on a network filesystem ({kind}): its locks are"
                    " not reliable, so messages could be lost or delivered twice; use a local disk"
                    " or PostgreSQL"
                )
        self._writer = _writer_for(self.path)
        self._free: deque[sqlite3.Connection | None] = deque([None] * pool_size)
        """A free slot for each connection the pool may hold: an idle connection, or
        ``None`` (not opened yet, or discarded). Taken from the right, as given back: the
        connection used last, its page cache the warmest."""
        self._given_back = threading.Condition(threading.Lock())
        self._waiting = 0
        """Threads waiting for a free slot (changed under ``_given_back``)."""
        self._closed = False
        self._token = object()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=self._busy_timeout,
            factory=_PooledConnection,
        )
        conn.pool_token = self._token
        try:
            conn.row_factory = sqlite3.Row
            # sqlite3.connect(timeout=) already set the busy timeout (sqlite3_busy_timeout).
            if not self.memory:
                mode = self._wal_mode(conn)
                if str(mode).lower() != "wal":
                    raise ConfigurationError(f"SQLite refused WAL mode (got {mode!r})")
                conn.execute(SESSION["session_journal_limit"])
            conn.execute(_SYNCHRONOUS[self._synchronous])
            conn.execute(SESSION["session_foreign_keys"])
            self.register_functions(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _wal_mode(self, conn: sqlite3.Connection) -> str:
        """Switch the file to WAL (a no-op once it is) and return the journal mode.

        While another connection opens the same new file, this pragma can fail with
        SQLITE_BUSY at once, without calling the busy handler: wait for it here, up to the
        busy timeout, as for any other lock.
        """
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.001
        while True:
            try:
                return str(conn.execute(SESSION["session_wal"]).fetchone()[0])
            except sqlite3.OperationalError as error:
                busy = "locked" in str(error) or "busy" in str(error)
                if not busy or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    @staticmethod
    def register_functions(conn: sqlite3.Connection) -> None:
        conn.create_function("sqlbroker_regex_match", 2, regex_matches, deterministic=True)
        conn.create_function(
            "sqlbroker_pattern_match", 2, stored_pattern_matches, deterministic=True
        )

    @contextmanager
    def connection(self, *, committed: bool = False) -> Iterator[sqlite3.Connection]:
        """A pooled connection, in autocommit (a read's; :meth:`write` begins its
        transactions on one). A connection left inside a transaction or below the
        ``synchronous`` level is discarded, not given back; SQLite's errors are
        translated (``committed``: as :meth:`write`'s)."""
        if self._closed:
            raise StorageError("the broker is closed")
        conn = self._take()
        broken = False
        started = time.monotonic()
        try:
            if conn is None:
                conn = self._connect()
            yield conn
        except BaseException as error:
            broken = conn is not None and (conn.in_transaction or not self._at_level(conn))
            if isinstance(error, sqlite3.Error):
                raise translate(error, started, self._busy_timeout, committed=committed) from None
            raise
        finally:
            if conn is not None and (broken or self._closed):
                self._discard(conn)
                conn = None
            self._give_back(conn)

    def _take(self) -> sqlite3.Connection | None:
        """A free slot (see ``_free``), waiting for one when every slot is taken."""
        try:
            return self._free.pop()  # atomic: no lock when a slot is free
        except IndexError:
            pass
        with self._given_back:
            # Counted before looking again: a slot given back after this look is announced.
            self._waiting += 1
            try:
                while True:
                    try:
                        return self._free.pop()
                    except IndexError:
                        self._given_back.wait()
            finally:
                self._waiting -= 1

    def _give_back(self, slot: sqlite3.Connection | None) -> None:
        self._free.append(slot)
        if self._waiting:
            with self._given_back:
                self._given_back.notify()

    def _at_level(self, conn: sqlite3.Connection) -> bool:
        """Whether ``conn`` still commits at the configured ``synchronous`` level (a claim
        lowers it for its own transaction: see :meth:`write`)."""
        try:
            row = conn.execute(SESSION["session_synchronous"]).fetchone()
        except sqlite3.Error:
            return False
        return row is not None and row[0] == _SYNCHRONOUS_LEVEL[self._synchronous]

    @contextmanager
    def dedicated(self) -> Iterator[sqlite3.Connection]:
        """A connection of its own, outside the pool, for long-lived watchers."""
        with translated(self._busy_timeout):
            conn = self._connect()
        try:
            yield conn
        finally:
            self._discard(conn)

    @staticmethod
    def _discard(conn: sqlite3.Connection) -> None:
        with suppress(sqlite3.Error):
            conn.close()

    @contextmanager
    def write(
        self, conn: CallerConnection | None = None, *, flush: bool = True, committed: bool = False
    ) -> Iterator[sqlite3.Connection]:
        """A write transaction: ``BEGIN IMMEDIATE`` takes the write lock up front, so a
        busy database makes us wait (``busy_timeout``) instead of failing mid-transaction.
        With a caller's connection the caller owns the transaction; we never commit it.

        ``flush=False`` (a claim's own transaction) commits at ``synchronous = NORMAL``
        even when the pool's level is FULL: the commit does not wait for the WAL's fsync.
        A process crash loses nothing (the WAL is written); a crash of the machine can
        forget the transaction, until the next FULL commit syncs the WAL up to it.

        ``committed``: the operation's statements before this transaction have committed
        (a claim's after its commit point), which its errors then say."""
        if conn is not None:
            with translated(self._busy_timeout):
                raw = caller.unwrap(conn)
                if not isinstance(raw, sqlite3.Connection):
                    raise InvalidOption(
                        "conn",
                        "a SQLite broker needs a sqlite3.Connection (or SQLAlchemy / Django over"
                        f" sqlite3), not {caller.describe(raw)}",
                    )
                self._check_same_database(raw)
                self.register_functions(raw)
                with self._joined(raw):
                    yield raw
            return
        with self.connection(committed=committed) as own:
            # Threads of this process take turns on a Python lock: SQLite's busy handler
            # would put the losers to sleep in steps of up to 100 ms. busy_timeout still
            # arbitrates between processes.
            if not self._writer.acquire(timeout=self._busy_timeout):
                raise DatabaseBusy(
                    f"another thread held the SQLite write lock for more than"
                    f" {self._busy_timeout:g} s; {undone(committed, 'nothing was written')}"
                )
            relaxed = not flush and self._synchronous != "normal"
            try:
                if relaxed:
                    own.execute(_SYNCHRONOUS["normal"])
                own.execute(SESSION["write_begin"])
                try:
                    yield own
                except BaseException:
                    if own.in_transaction:
                        own.execute(SESSION["write_rollback"])
                    raise
                own.execute(SESSION["write_commit"])
            finally:
                try:
                    if relaxed:
                        # Back before the connection is reused; should this fail, the
                        # pool discards the connection (_at_level).
                        own.execute(_SYNCHRONOUS[self._synchronous])
                finally:
                    self._writer.release()

    def _check_same_database(self, raw: sqlite3.Connection) -> None:
        if isinstance(raw, _PooledConnection) and raw.pool_token is self._token:
            return
        if self.memory:
            raise InvalidOption("conn", "an in-memory broker cannot share a caller's connection")
        files = [
            row[2] for row in raw.execute(SESSION["session_database_list"]) if row[1] == "main"
        ]
        if not files or os.path.realpath(files[0]) != os.path.realpath(self.path):
            raise InvalidOption(
                "conn",
                f"is connected to {files[0] if files and files[0] else 'another database'},"
                f" not to this broker's {self.path}",
            )

    @staticmethod
    @contextmanager
    def _joined(raw: sqlite3.Connection) -> Iterator[None]:
        """Our statements inside the caller's transaction, which we never commit or roll
        back: a savepoint undoes just our part when we fail. With no transaction open, an
        autocommit connection gets one of our own around the publish, and a connection in
        sqlite3's default (legacy) mode gets the ``BEGIN`` its next INSERT would have
        issued — the caller's ``commit()`` then commits it."""
        savepoint = raw.in_transaction
        raw.execute(SESSION["savepoint" if savepoint else "write_begin"])
        try:
            yield
        except BaseException:
            if raw.in_transaction:
                raw.execute(SESSION["savepoint_rollback" if savepoint else "write_rollback"])
                if savepoint:
                    raw.execute(SESSION["savepoint_release"])
            raise
        if savepoint:
            raw.execute(SESSION["savepoint_release"])
        elif raw.isolation_level is None:
            raw.execute(SESSION["write_commit"])

    def close(self) -> None:
        self._closed = True
        # The idle connections closed, their slots kept; one in use is closed when given
        # back (connection).
        idle = []
        with suppress(IndexError):
            for _ in range(len(self._free)):
                idle.append(self._free.pop())
        for conn in idle:
            self._give_back(None)
            if conn is not None:
                self._discard(conn)
