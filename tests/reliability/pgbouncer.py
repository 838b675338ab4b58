"""A PgBouncer of the test's own (Debian's ``pgbouncer``), in front of a test PostgreSQL.

Started as a subprocess with a generated ini in a temporary directory, listening on a free
loopback port; ``trust`` authentication for the users it is told about. PgBouncer refuses
to run as root, so a root test session runs it as the ``postgres`` OS account (as
``pgserver`` does the server).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return os.access(BINARY, os.X_OK)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """``PgBouncer(server_url, pool_mode="transaction")``; :meth:`url_for` maps a URL of
    the server to the same database through the pooler."""

    def __init__(
        self, server_url: str, *, pool_mode: str = "transaction", pool_size: int = 10
    ) -> None:
        parts = urlsplit(server_url)
        self._server_host = parts.hostname or "127.0.0.1"
        self._server_port = parts.port or 5432
        self.user = parts.username or "postgres"
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = _free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="sqlbroker-pgbouncer-"))
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        ini = self._dir / "pgbouncer.ini"
        users = self._dir / "users.txt"
        users.write_text(f'"{self.user}" ""\n')
        ini.write_text(
            "[databases]\n"
            f"* = host={self._server_host} port={self._server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self._dir}\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            "server_check_delay = 0\n"
        )
        run_as = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if run_as is not None:
            for path in (self._dir, ini, users):
                os.chown(path, run_as.pw_uid, run_as.pw_gid)
        self._process = subprocess.Popen(
            [BINARY, str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=run_as.pw_uid if run_as else None,
            group=run_as.pw_gid if run_as else None,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen within 30 s: {self.log()}")

    def url_for(self, server_url: str) -> str:
        """``server_url``'s database and user, through this pooler."""
        parts = urlsplit(server_url)
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))

    def log(self) -> str:
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)
