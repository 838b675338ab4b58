"""Throwaway PostgreSQL server for the test suite (stdlib only).

Usage::

    with PostgresServer() as pg:
        pg.create_database("app")
        dsn = pg.url("app")  # postgresql://postgres@127.0.0.1:PORT/app

The server lives in a fresh temporary directory, listens on a free loopback
TCP port and on a private unix socket directory, uses ``trust`` auth with the
superuser ``postgres``, and is tuned for speed rather than durability.  It is
removed again by :meth:`PostgresServer.stop`, which also runs at interpreter
exit so that a crashed test session never leaves a server behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

__all__ = ["PostgresServer", "find_bin_dir", "quote_ident", "quote_literal"]

BIN_DIR_ENV = "SQLBROKER_PG_BIN"
SUPERUSER = "postgres"
# The OS account the server runs as when the test session itself is root.
SERVER_OS_USER = "postgres"

ShutdownMode = Literal["smart", "fast", "immediate"]

_START_TIMEOUT = 60  # seconds, passed to ``pg_ctl -t``
_COMMAND_TIMEOUT = 180  # seconds, hard limit for any helper subprocess
_LOG_TAIL_CHARS = 4000
# sockaddr_un.sun_path is ~107 bytes; keep the socket dir well below that.
_MAX_TEMP_PARENT_LEN = 64


def find_bin_dir() -> Path:
    """Return the directory holding the PostgreSQL server binaries.

    Lookup order: ``$SQLBROKER_PG_BIN``, ``pg_config --bindir``, the highest
    ``/usr/lib/postgresql/*/bin`` containing ``initdb``, then ``initdb`` on
    ``PATH``.  Raises ``RuntimeError`` if nothing usable is found, or if
    ``$SQLBROKER_PG_BIN`` is set but does not contain ``initdb``.
    """
    explicit = os.environ.get(BIN_DIR_ENV)
    if explicit:
        path = Path(explicit)
        if not _has_server_binaries(path):
            raise RuntimeError(
                f"{BIN_DIR_ENV}={explicit!r} does not contain initdb and pg_ctl; point it "
                "at a PostgreSQL bin directory or unset it (install the server with "
                "`apt-get install postgresql`)"
            )
        return path

    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        # Debian's pg_config may come from libpq-dev and point at a bindir
        # of a server version that is not installed.
        if out and _has_server_binaries(Path(out)):
            return Path(out)

    versioned = [
        path for path in Path("/usr/lib/postgresql").glob("*/bin") if _has_server_binaries(path)
    ]
    if versioned:
        return max(versioned, key=lambda p: _version_key(p.parent.name))

    initdb = shutil.which("initdb")
    if initdb:
        # Resolve symlinks such as /usr/local/bin/initdb so that sibling
        # tools are looked up next to the real binary.
        path = Path(os.path.realpath(initdb)).parent
        if _has_server_binaries(path):
            return path

    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found. Install them "
        "with `apt-get install postgresql`, or set "
        f"{BIN_DIR_ENV} to the directory containing initdb."
    )


class PostgresServer:
    """A private PostgreSQL cluster started on demand and deleted on stop.

    Contract:

    * :meth:`start` creates a new cluster in ``tempfile.mkdtemp(prefix=
      "sqlbroker-pg-")`` and returns once the server accepts connections.
    * :attr:`host` (unix socket directory) and :attr:`port` are only valid
      while the server is running; the port stays the same across
      :meth:`restart`.
    * The superuser is always ``postgres`` and authentication is ``trust``
      on both the socket and ``127.0.0.1``; no password is needed.
    * When the process runs as root, the server runs as the OS user
      ``postgres`` because PostgreSQL refuses to run as root.
    * Durability is deliberately disabled (see :meth:`restart`) unless
      ``durable=True``, which keeps PostgreSQL's defaults (``fsync``,
      ``synchronous_commit`` and ``full_page_writes`` on), e.g. for benchmarks.
    * :meth:`stop` is idempotent and also registered with ``atexit``.
    """

    def __init__(
        self,
        bin_dir: str | os.PathLike[str] | None = None,
        *,
        durable: bool = False,
        settings: dict[str, str] | None = None,
        initdb_options: Sequence[str] = (),
    ) -> None:
        """Prepare a server; nothing is started until :meth:`start`.

        ``bin_dir`` overrides binary discovery (see :func:`find_bin_dir`).
        ``durable=True`` leaves ``fsync``, ``synchronous_commit`` and
        ``full_page_writes`` at PostgreSQL's (durable) defaults. ``settings``
        are more server settings (e.g. ``synchronous_standby_names``);
        ``initdb_options`` more options for ``initdb`` (e.g. ``--wal-segsize=1``).
        """
        self._durable = durable
        self._initdb_options = list(initdb_options)
        self._extra_settings = dict(settings or {})
        self._bin_dir = Path(bin_dir) if bin_dir is not None else find_bin_dir()
        self._initdb = self._tool("initdb")
        self._pg_ctl = self._tool("pg_ctl")
        self._pg_basebackup = self._tool("pg_basebackup")
        self._psql = self._tool("psql")
        self._run_as: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._run_as = pwd.getpwnam(SERVER_OS_USER)
            except KeyError:
                raise RuntimeError(
                    f"running as root, but OS user {SERVER_OS_USER!r} does not "
                    "exist to run PostgreSQL (apt-get install postgresql "
                    "creates it)"
                ) from None
        self._base_dir: Path | None = None
        self._port: int | None = None
        self._running = False

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> PostgresServer:
        """Create the cluster and start the server; return ``self``.

        Raises ``RuntimeError`` (with the tail of the server log) if the
        cluster cannot be initialised or the server does not come up within
        60 seconds, and if the server is already running.
        """
        if self._running or self._base_dir is not None:
            raise RuntimeError("PostgreSQL test server is already started")
        self._base_dir = Path(tempfile.mkdtemp(prefix="sqlbroker-pg-", dir=self._temp_parent()))
        atexit.register(self.stop)
        try:
            self._make_dirs()
            self._initdb_cluster()
            self._start_server()
        except BaseException:
            self.stop()
            raise
        return self

    def start_standby(self, primary: PostgresServer) -> PostgresServer:
        """Start this server as a streaming standby of ``primary``; return ``self``.

        Its cluster is a ``pg_basebackup -R`` of the primary (the primary's
        default ``pg_hba.conf`` lets ``127.0.0.1`` replicate with ``trust``),
        so it follows the primary until :meth:`promote`. Make it synchronous by
        starting the primary with ``settings={"synchronous_standby_names": "*"}``.
        """
        if self._running or self._base_dir is not None:
            raise RuntimeError("PostgreSQL test server is already started")
        self._base_dir = Path(tempfile.mkdtemp(prefix="sqlbroker-pg-", dir=self._temp_parent()))
        atexit.register(self.stop)
        try:
            self._make_dirs()
            proc = self._run(
                [
                    self._pg_basebackup,
                    "-D",
                    str(self._data_dir),
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(primary.port),
                    "-U",
                    SUPERUSER,
                ],
                as_server=True,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"pg_basebackup failed: {(proc.stdout + proc.stderr).strip()}")
            self._start_server()
        except BaseException:
            self.stop()
            raise
        return self

    def promote(self) -> None:
        """Promote a standby to a primary (``pg_ctl promote``, waiting until it is)."""
        self._require_running()
        proc = self._run(
            [self._pg_ctl, "promote", "-D", str(self._data_dir), "-w", "-t", str(_START_TIMEOUT)],
            as_server=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed: {(proc.stdout + proc.stderr).strip()}")

    def kill_postmaster(self) -> None:
        """SIGKILL the postmaster alone, as a crash of the server's host would end it: its
        backends find it gone and exit, and the server stays down. :meth:`stop` cleans up."""
        self._require_running()
        pid = int((self._data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, signal.SIGKILL)
        self._running = False

    def stop(self) -> None:
        """Stop the server immediately and delete its directory.

        Safe to call any number of times, including after a failed start.
        Errors are ignored: this is cleanup.
        """
        atexit.unregister(self.stop)
        self._running = False
        base_dir = self._base_dir
        if base_dir is None:
            return
        # Also covers a server left half-started by a failed start/restart.
        if (self._data_dir / "postmaster.pid").exists():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._run(
                    [self._pg_ctl, "stop", "-D", str(self._data_dir), "-m", "immediate", "-w"],
                    as_server=True,
                    check=False,
                )
        self._base_dir = None
        self._port = None
        shutil.rmtree(base_dir, ignore_errors=True)

    def halt(self, mode: ShutdownMode = "fast") -> None:
        """Stop the server and keep its data directory: the database is gone until
        :meth:`resume` starts it again on the same port."""
        self._require_running()
        self._running = False
        self._run(
            [self._pg_ctl, "stop", "-D", str(self._data_dir), "-m", mode, "-w"],
            as_server=True,
            check=True,
        )

    def resume(self) -> None:
        """Start the server that :meth:`halt` stopped, on the same port and data."""
        self._pg_ctl_start("start")

    def restart(self, mode: ShutdownMode = "fast") -> None:
        """Restart the server on the same port and socket directory.

        ``mode="immediate"`` simulates a crash: the server comes back through
        crash recovery.  Because ``synchronous_commit=off``, transactions
        committed within the last few hundred milliseconds before an
        immediate restart may be lost; commit with ``SET synchronous_commit
        = on`` when a test needs the data to survive.
        """
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"invalid shutdown mode: {mode!r}")
        self._require_running()
        self._pg_ctl_start("restart", "-m", mode)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- connection details ------------------------------------------------

    @property
    def host(self) -> str:
        """The unix socket directory (usable as libpq ``host``)."""
        self._require_running()
        return str(self._socket_dir)

    @property
    def port(self) -> int:
        """The TCP port on ``127.0.0.1`` (also the socket's port number)."""
        self._require_running()
        assert self._port is not None
        return self._port

    @property
    def superuser(self) -> str:
        """The superuser role name, always ``postgres``."""
        return SUPERUSER

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        self._require_running()
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """The server log file (inside the data directory)."""
        self._require_running()
        return self._log_path

    def url(self, dbname: str = "postgres") -> str:
        """libpq URL for ``dbname`` over TCP loopback, e.g.
        ``postgresql://postgres@127.0.0.1:PORT/dbname``."""
        return (
            f"postgresql://{quote(self.superuser, safe='')}@127.0.0.1:"
            f"{self.port}/{quote(dbname, safe='')}"
        )

    def socket_url(self, dbname: str = "postgres") -> str:
        """libpq URL for ``dbname`` over the unix socket, e.g.
        ``postgresql://postgres@/dbname?host=/tmp/...&port=PORT``."""
        return (
            f"postgresql://{quote(self.superuser, safe='')}@/"
            f"{quote(dbname, safe='')}?host={quote(self.host, safe='/')}"
            f"&port={self.port}"
        )

    # -- SQL helpers (via psql over the unix socket) -----------------------

    def execute(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` with ``psql -At`` as the superuser and return stdout.

        The trailing newline is stripped.  Several statements in one string
        run in a single transaction and only the last result is printed.
        Raises ``RuntimeError`` with psql's stderr on any SQL error.
        """
        self._require_running()
        # Everything goes through one conninfo string so that a database
        # name containing "=" or looking like a URI is not reinterpreted.
        conninfo = " ".join(
            f"{key}={_conninfo_quote(value)}"
            for key, value in (
                ("host", self.host),
                ("port", str(self.port)),
                ("user", self.superuser),
                ("dbname", dbname),
            )
        )
        cmd = [self._psql, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-c", sql]
        proc = self._run(cmd, as_server=False, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                f"psql failed (exit {proc.returncode}) on database {dbname!r}: "
                f"{proc.stderr.strip()}\nSQL: {sql}"
            )
        return proc.stdout.removesuffix("\n")

    def create_database(self, name: str, template: str | None = None) -> None:
        """Create database ``name``, optionally copied from ``template``.

        PostgreSQL refuses to copy a template that has open connections;
        call :meth:`terminate_backends` on it first if needed.
        """
        sql = f"CREATE DATABASE {quote_ident(name)}"
        if template is not None:
            sql += f" TEMPLATE {quote_ident(template)}"
        self.execute(sql)

    def drop_database(self, name: str, missing_ok: bool = False) -> None:
        """Drop database ``name``, terminating its connections first."""
        if_exists = "IF EXISTS " if missing_ok else ""
        self.execute(f"DROP DATABASE {if_exists}{quote_ident(name)} WITH (FORCE)")

    def terminate_backends(self, dbname: str) -> int:
        """Terminate all other sessions connected to ``dbname``.

        Returns the number of backends signalled.
        """
        out = self.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE datname = {quote_literal(dbname)} "
            "AND pid <> pg_backend_pid()"
        )
        return int(out)

    # -- internals ---------------------------------------------------------

    @property
    def _data_dir(self) -> Path:
        return self._require_base() / "data"

    @property
    def _socket_dir(self) -> Path:
        return self._require_base() / "socket"

    @property
    def _log_path(self) -> Path:
        return self._data_dir / "server.log"

    def _require_base(self) -> Path:
        if self._base_dir is None:
            raise RuntimeError("PostgreSQL test server is not started")
        return self._base_dir

    def _require_running(self) -> None:
        if not self._running:
            raise RuntimeError("PostgreSQL test server is not running")

    def _tool(self, name: str) -> str:
        candidate = self._bin_dir / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(
                f"{name} not found in {self._bin_dir} or on PATH; install it "
                "with `apt-get install postgresql`"
            )
        return found

    def _temp_parent(self) -> str | None:
        parent = tempfile.gettempdir()
        too_long = len(parent) > _MAX_TEMP_PARENT_LEN
        blocked = self._run_as is not None and not _world_searchable(Path(parent))
        if (too_long or blocked) and os.path.isdir("/tmp"):
            return "/tmp"
        return None

    def _make_dirs(self) -> None:
        base = self._require_base()
        data_dir, socket_dir = self._data_dir, self._socket_dir
        data_dir.mkdir(mode=0o700)
        socket_dir.mkdir(mode=0o755)
        if self._run_as is not None:
            # Root keeps owning the base dir (so it can always clean up); the
            # server user only needs to traverse it.
            base.chmod(0o711)
            for path in (data_dir, socket_dir):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)

    def _initdb_cluster(self) -> None:
        common = [
            self._initdb,
            "-D",
            str(self._data_dir),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            # Skip fsyncing the new cluster: it is thrown away anyway.
            "--no-sync",
            *self._initdb_options,
        ]
        proc = self._run([*common, "--locale=C.UTF-8"], as_server=True, check=False)
        if proc.returncode == 0:
            return
        # C.UTF-8 is missing on some systems (older glibc, macOS); initdb
        # leaves the data dir empty on failure, so simply retry.
        first_error = proc.stdout + proc.stderr
        proc = self._run([*common, "--no-locale"], as_server=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                "initdb failed with --locale=C.UTF-8:\n"
                f"{first_error.strip()}\nand with --no-locale:\n"
                f"{(proc.stdout + proc.stderr).strip()}"
            )

    def _start_server(self) -> None:
        # Another process can grab the probed port before the server binds
        # it; retry with a new port in that (rare) case.
        for attempt in range(3):
            self._port = _free_port()
            try:
                self._pg_ctl_start("start")
                return
            except RuntimeError as exc:
                if attempt == 2 or "Address already in use" not in str(exc):
                    raise

    def _pg_ctl_start(self, action: str, *extra: str) -> None:
        assert self._port is not None
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self._port),
            "unix_socket_directories": str(self._socket_dir),
        }
        if not self._durable:
            # Durability is traded for speed: a test cluster never has to
            # survive an OS crash, and these make DDL-heavy tests much faster.
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        settings |= {
            **self._extra_settings,
            "max_connections": "300",
            "shared_buffers": "128MB",
            # pg_ctl -l captures stderr; the collector would redirect it away.
            "logging_collector": "off",
        }
        # pg_ctl hands -o to the server through /bin/sh, hence the quoting.
        options = " ".join(
            f"-c {shlex.quote(f'{name}={value}')}" for name, value in settings.items()
        )
        log_offset = _file_size(self._log_path)
        self._running = False
        proc = self._run(
            [
                self._pg_ctl,
                action,
                *extra,
                "-D",
                str(self._data_dir),
                "-l",
                str(self._log_path),
                "-w",
                "-t",
                str(_START_TIMEOUT),
                "-o",
                options,
            ],
            as_server=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"pg_ctl {action} failed (exit {proc.returncode}): "
                f"{(proc.stdout + proc.stderr).strip()}\n"
                f"--- server log ({self._log_path}) ---\n"
                f"{_tail(self._log_path, log_offset)}"
            )
        self._running = True

    def _run(
        self, cmd: Sequence[str], *, as_server: bool, check: bool
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd``; with ``as_server`` as the server's OS user if root."""
        # subprocess drops privileges in the child (setgroups/setgid/setuid),
        # so neither runuser nor su is needed.
        drop = as_server and self._run_as is not None
        return subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            check=check,
            env=_clean_env(),
            # The caller's cwd (e.g. /root) may be unreadable by the server
            # user, which makes initdb and pg_ctl complain.
            cwd=self._base_dir,
            stdin=subprocess.DEVNULL,
            timeout=_COMMAND_TIMEOUT,
            user=self._run_as.pw_uid if drop and self._run_as else None,
            group=self._run_as.pw_gid if drop and self._run_as else None,
            extra_groups=[] if drop else None,
        )


def quote_ident(name: str) -> str:
    """Quote ``name`` as an SQL identifier."""
    if "\x00" in name:
        raise ValueError("identifier must not contain NUL")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """Quote ``value`` as an SQL string literal (standard_conforming_strings)."""
    if "\x00" in value:
        raise ValueError("literal must not contain NUL")
    return "'" + value.replace("'", "''") + "'"


def _conninfo_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _has_server_binaries(path: Path) -> bool:
    return all(os.access(path / tool, os.X_OK) for tool in ("initdb", "pg_ctl"))


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name))


def _world_searchable(path: Path) -> bool:
    """True if every directory from ``/`` to ``path`` is o+x."""
    for directory in (path.resolve(), *path.resolve().parents):
        try:
            if not directory.stat().st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_env() -> dict[str, str]:
    # PG* variables from the developer's shell (PGOPTIONS, PGSERVICE,
    # PGDATA, ...) must not leak into our private server or its clients.
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, offset: int = 0) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(offset, _file_size(path) - _LOG_TAIL_CHARS))
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<could not read log: {exc}>"
