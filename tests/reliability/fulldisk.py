"""Full disks for the fault scenarios: a small tmpfs of a test's own, a filler file that
takes its free space, and a PostgreSQL server whose whole data directory lives on one.

Mounting needs root (CAP_SYS_ADMIN); where the kernel refuses it (``EPERM``), the tests
skip with that reason. Every mount is undone when its context ends, whatever happened.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgserver import PostgresServer

_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(target: Path, *, size_mb: int, uid: int = 0, gid: int = 0) -> None:
    """Mount a tmpfs of ``size_mb`` MiB on ``target`` (owned by ``uid``/``gid``, mode
    0700); skip the test if the kernel refuses (``EPERM``: not root, or no
    ``CAP_SYS_ADMIN`` in this container)."""
    options = f"size={size_mb}m,mode=0700,uid={uid},gid={gid}".encode()
    if _libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", 0, options) != 0:
        code = ctypes.get_errno()
        if code == errno.EPERM:
            pytest.skip(f"mount -t tmpfs on {target} refused: {os.strerror(code)} (EPERM)")
        raise OSError(code, f"mount -t tmpfs on {target}: {os.strerror(code)}")


def unmount(target: Path) -> None:
    """Unmount ``target``; lazily if something still holds a file open on it."""
    if _libc.umount2(os.fsencode(target), 0) == 0:
        return
    if ctypes.get_errno() == errno.EBUSY and _libc.umount2(os.fsencode(target), _MNT_DETACH) == 0:
        return
    code = ctypes.get_errno()
    raise OSError(code, f"umount {target}: {os.strerror(code)}")


@contextmanager
def tmpfs(target: Path, *, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB on ``target`` (created if missing) for the block."""
    target.mkdir(parents=True, exist_ok=True)
    mount_tmpfs(target, size_mb=size_mb)
    try:
        yield target
    finally:
        unmount(target)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still write on ``path``'s filesystem."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill(filler: Path, *, leave: int) -> int:
    """Grow ``filler`` until at most ``leave`` bytes of its filesystem stay free (or none
    at all); return its size. The load then fills the last bytes itself."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = os.fstat(fd).st_size
        wanted = size + max(0, free_bytes(filler.parent) - leave)
        try:
            if wanted > size:
                os.posix_fallocate(fd, 0, wanted)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            # The load took some of the space meanwhile: fill what is left.
            chunk = bytes(4096)
            try:
                while os.write(fd, chunk):
                    pass
            except OSError as full:
                if full.errno != errno.ENOSPC:
                    raise
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


class TmpfsServer(PostgresServer):
    """A durable PostgreSQL server whose whole data directory (``base``, ``pg_wal``,
    ``pg_xact``, its log) is a tmpfs of ``size_mb`` MiB, with 1 MiB WAL segments so that
    a small disk still holds several. :meth:`stop` also unmounts it."""

    def __init__(self, *, size_mb: int, settings: dict[str, str] | None = None) -> None:
        super().__init__(durable=True, settings=settings, initdb_options=["--wal-segsize=1"])
        self.size_mb = size_mb
        self._mounted: Path | None = None

    def _make_dirs(self) -> None:
        super()._make_dirs()
        data_dir = self._data_dir
        owner = self._run_as
        mount_tmpfs(
            data_dir,
            size_mb=self.size_mb,
            uid=owner.pw_uid if owner else os.getuid(),
            gid=owner.pw_gid if owner else os.getgid(),
        )
        self._mounted = data_dir

    @property
    def filler(self) -> Path:
        """Where the tests put their filler file (in the data directory, which PostgreSQL
        leaves alone: it never lists unknown files there)."""
        return self.data_dir / "filler"

    def postmaster_alive(self) -> bool:
        """Whether the server's postmaster still runs (a crash restarts the server from
        it; when its crash recovery fails too, it shuts down and stays down)."""
        try:
            pid = int((self._data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        return True

    def start_again(self) -> None:
        """Start the server that shut itself down, on the same port, as a supervisor
        (systemd's ``Restart=``, Patroni) would."""
        self._pg_ctl_start("start")

    def stop(self) -> None:
        mounted, self._mounted = self._mounted, None
        try:
            super().stop()
        finally:
            if mounted is not None:
                unmount(mounted)
                # super().stop() could not remove the mount point while mounted.
                shutil.rmtree(mounted.parent, ignore_errors=True)
