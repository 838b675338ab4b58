"""A TCP proxy on 127.0.0.1 that injects network faults between clients and a server.

Put one in front of the processes whose network should fail (its ``url_for`` rewrites a
database URL to go through it) and switch its mode while they run:

- ``pass``: bytes are forwarded both ways (after ``latency`` seconds, if set);
- ``reset``: every open connection is aborted with a TCP RST, and so is every new one;
- ``silent``: half-open silence: every open connection stops forwarding without being
  closed, as when a NAT or load balancer drops its state or the server's host is lost.
  Such a connection stays silent for good (its state is gone), also after the mode goes
  back to ``pass``; new connections made meanwhile are accepted and stay silent too.

Threads, not asyncio: the test drives the proxy from its own (synchronous) code, and a
blocking ``recv`` per direction is the simplest correct pump.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

Mode = Literal["pass", "reset", "silent"]
_CHUNK = 65536


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.silent = False
        self.closed = False

    def abort(self) -> None:
        """Close both sockets with a RST (SO_LINGER 0)."""
        self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    """Listens on a free port of 127.0.0.1 and forwards to ``target`` (host, port)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._mode: Mode = "pass"
        self.latency = 0.0
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stopped = False
        self._acceptor = threading.Thread(target=self._accept, name="faultproxy", daemon=True)
        self._acceptor.start()

    def url_for(self, url: str) -> str:
        """``url`` (one host) with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def mode(self) -> Mode:
        return self._mode

    def set_mode(self, mode: Mode) -> None:
        with self._lock:
            self._mode = mode
            links = list(self._links)
        for link in links:
            if mode == "reset":
                link.abort()
            elif mode == "silent":
                link.silent = True
        if mode == "reset":
            with self._lock:
                self._links = [link for link in self._links if not link.closed]

    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for link in self._links if not link.closed)

    def stop(self) -> None:
        """Stop accepting and close every connection (a FIN to both sides)."""
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._mode == "reset":
                _Link(client, socket.socket()).abort()
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                _Link(client, socket.socket()).abort()
                continue
            link = _Link(client, server)
            link.silent = self._mode == "silent"
            with self._lock:
                self._links.append(link)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(link, source, sink), name="faultproxy", daemon=True
                ).start()

    def _pump(self, link: _Link, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not link.closed:
                data = source.recv(_CHUNK)
                if not data:
                    break
                if link.silent:
                    continue  # the state is gone: nothing goes through any more
                if self.latency:
                    time.sleep(self.latency)
                sink.sendall(data)
        except OSError:
            pass
        if not link.silent and not link.closed:
            link.close()
