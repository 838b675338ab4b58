"""The settings of sqlbroker's PostgreSQL sessions: the validated pool options, the libpq
keyword arguments of every connection (session settings, TCP keepalives, what a pooler
allows) and where a LISTEN session connects."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from sqlbroker.core import validate
from sqlbroker.core.errors import InvalidOption
from sqlbroker.storage.postgres.adapters import ADAPTERS
from sqlbroker.storage.url import DatabaseURL


def _parameters(url: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(url)
    except psycopg.Error:
        return {}  # a malformed URL fails at connect, with the driver's (redacted) reason


def _milliseconds(seconds: float) -> int:
    """A timeout setting's value: 0 (off) stays 0, anything else at least 1 ms."""
    return 0 if seconds == 0 else max(1, round(seconds * 1000))


class SessionOptions:
    """The options of a backend's PostgreSQL sessions, validated once."""

    def __init__(
        self,
        url: DatabaseURL,
        *,
        pool_size: int,
        synchronous_commit: str,
        connect_timeout: float,
        application_name: str,
        network_timeout: float = 30.0,
        lock_timeout: float | None = None,
        statement_timeout: float | None = None,
        pooler: str | None = None,
        listen_url: DatabaseURL | None = None,
    ) -> None:
        if not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
            raise InvalidOption("pool_size", "must be an integer from 1 to 1000")
        if synchronous_commit not in ("on", "off", "local", "remote_write", "remote_apply"):
            raise InvalidOption(
                "synchronous_commit", "must be on, off, local, remote_write or remote_apply"
            )
        if not isinstance(connect_timeout, int | float) or not 0 < connect_timeout <= 600:
            raise InvalidOption("connect_timeout", "must be seconds, more than 0 and at most 600")
        if (
            not isinstance(network_timeout, int | float)
            or isinstance(network_timeout, bool)
            or not 1 <= network_timeout <= 3600
        ):
            raise InvalidOption("network_timeout", "must be seconds, from 1 to 3600")
        if pooler not in (None, "session", "transaction"):
            raise InvalidOption(
                "pooler",
                "must be None (a direct connection), 'session' or 'transaction' (the pooling"
                " mode of a PgBouncer-like pooler between sqlbroker and PostgreSQL; statement"
                " pooling cannot run sqlbroker's transactions)",
            )
        self.url = url
        self.pooler = pooler
        self.listen_url = listen_url
        # Defaults below network_timeout, so that a wait on a lock held elsewhere (or a
        # statement running long) fails cleanly on the server before the watchdog has to
        # cut the connection, which leaves the outcome unknown.
        self.lock_timeout = (
            network_timeout / 3
            if lock_timeout is None
            else validate.seconds(lock_timeout, "lock_timeout", maximum=3600)
        )
        self.statement_timeout = (
            network_timeout * 2 / 3
            if statement_timeout is None
            else validate.seconds(statement_timeout, "statement_timeout", maximum=3600)
        )
        self.pool_size = pool_size
        self.connect_timeout = float(connect_timeout)
        self.network_timeout = float(network_timeout)
        self.synchronous_commit = synchronous_commit
        """The sessions' ``synchronous_commit``: how durable a commit is before it returns."""
        self.application_name = application_name
        if pooler == "transaction":
            self._check_poolable()

    def connection_kwargs(self) -> dict[str, Any]:
        """Settings for the connections of the pools (through the pooler, if any).

        ``options`` from the URL (e.g. ``?options=-c%20role%3Dsqlbroker_migrator``, so that
        a migration creates objects owned by the migrator group) are kept, ours appended.
        TCP keepalives and ``tcp_user_timeout`` default to values derived from
        ``network_timeout`` (a dead peer is noticed within it), each unless the URL sets it.
        Behind a transaction pooler (``pooler="transaction"``) no session setting travels
        (the pooler refuses the startup ``options``, and a session's settings would stay
        on whichever server connection ran them) and nothing is prepared on the server
        (the next transaction may run on a server connection that never saw it).
        """
        return self._kwargs(self._url_parameters, pooled=self.pooler == "transaction")

    def _check_poolable(self) -> None:
        """Refuse, behind a transaction pooler, the settings that only a session carries."""
        if self._url_parameters.get("options"):
            raise InvalidOption(
                "pooler",
                "a transaction pooler does not pass the URL's options= to the server (and"
                " PgBouncer refuses the connection): set them on the role instead (ALTER ROLE"
                " … SET …), see docs/reliability.md",
            )
        if self.synchronous_commit != "on":
            raise InvalidOption(
                "synchronous_commit",
                "cannot be set per session behind a transaction pooler: set it on the role"
                " (ALTER ROLE … SET synchronous_commit = …) and leave this option 'on'",
            )

    def listen_target(self) -> tuple[str, dict[str, Any]] | None:
        """The URL and settings of a LISTEN session: ``listen_url`` when given, else the
        pools' URL — or ``None`` behind a transaction pooler without ``listen_url``, which
        would deliver notifications to whichever client holds the server connection (the
        poll alone then finds new messages)."""
        if self.listen_url is not None:
            return self.listen_url.raw, self._kwargs(_parameters(self.listen_url.raw), pooled=False)
        if self.pooler == "transaction":
            return None
        return self.url.raw, self.connection_kwargs()

    def _kwargs(self, parameters: Mapping[str, Any], *, pooled: bool) -> dict[str, Any]:
        network = {
            name: value
            for name, value in self._network_defaults().items()
            if name not in parameters
        }
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "context": ADAPTERS,
            "connect_timeout": max(1, int(self.connect_timeout)),
            "application_name": self.application_name,
            **network,
        }
        if pooled:
            kwargs["prepare_threshold"] = None
            return kwargs
        # TimeZone UTC: psycopg then returns times as datetime.UTC, which the claim's row
        # conversion takes as is (another zone costs an astimezone per column and row). No
        # statement depends on the session's zone: times are timestamptz, shown in UTC.
        # jit off: JIT compiles a plan whose estimate passes jit_above_cost on every run
        # (the code is not cached), and sqlbroker's statements are short: a routed batch
        # of 500 (message_insert, estimated at millions) ran 19 ms and compiled for 200+.
        ours = (
            f"-c synchronous_commit={self.synchronous_commit} -c TimeZone=UTC"
            " -c jit=off"
            f" -c lock_timeout={_milliseconds(self.lock_timeout)}"
            f" -c statement_timeout={_milliseconds(self.statement_timeout)}"
        )
        url_options = parameters.get("options") or ""
        kwargs["options"] = f"{url_options} {ours}" if url_options else ours
        return kwargs

    def _network_defaults(self) -> dict[str, str]:
        """libpq's TCP settings that bound how long a dead peer goes unnoticed: an idle
        connection is probed after a third of ``network_timeout`` and given up after three
        unanswered probes a sixth apart; data sent and not acknowledged within
        ``network_timeout`` closes it (``tcp_user_timeout``, Linux). Unix sockets ignore them.
        """
        timeout = self.network_timeout
        return {
            "keepalives": "1",
            "keepalives_idle": str(max(1, round(timeout / 3))),
            "keepalives_interval": str(max(1, round(timeout / 6))),
            "keepalives_count": "3",
            "tcp_user_timeout": str(int(timeout * 1000)),
        }

    @functools.cached_property
    def _url_parameters(self) -> dict[str, Any]:
        return _parameters(self.url.raw)
