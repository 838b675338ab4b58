"""What every command shares: the lazily opened broker and the translation of failures.

Contract of the whole CLI, enforced here once:

- an ``SqlbrokerError`` becomes one red ``error: …`` line on stderr and exit code 2 for a
  ``ValidationError`` (bad input, nothing written) or a ``ConfigurationError`` (a URL,
  login or setting that cannot work), 1 for anything else: a ``NotFound`` (a subscription,
  saga, schedule, dead letter or message that does not exist) is a failure of the
  command, not bad input, so every command naming one that is missing exits 1;
- a click usage error (unknown option, bad value) is one such line too, exit code 2, with
  a pointer to ``--help``;
- a read-only command never creates a database or runs a migration: a missing SQLite file
  is an exit-2 error naming it;
- Ctrl-C (or an interrupted prompt) exits 130 without a traceback;
- any other exception is reported the same way with exit code 1, unless
  ``SQLBROKER_DEBUG`` is set, in which case it propagates with its traceback;
- every message that reaches the terminal passes through :func:`redact`, so a DSN
  password is never printed.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar, cast

import click

from sqlbroker.app import Broker
from sqlbroker.core.errors import ConfigurationError, SqlbrokerError, ValidationError
from sqlbroker.interfaces.cli.render import escape_controls
from sqlbroker.storage.url import parse_url, redact

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEBUG_ENV = "SQLBROKER_DEBUG"

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class CliFailure(click.ClickException):
    """A failure reported as a single red ``error: …`` line on stderr, exit code 1.

    The message is redacted and folded onto one line.
    """

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(escape_controls(" ".join(redact(message).split())))

    def show(self, file: IO[Any] | None = None) -> None:
        click.secho(f"error: {self.message}", fg="red", file=file, err=file is None)


class InvalidUsage(CliFailure):
    """Like :class:`CliFailure`, for input the command refuses: exit code 2."""

    exit_code = EXIT_USAGE


class Session:
    """The state of one invocation: the database URL and a broker opened on first use.

    Commands that never touch the database (``schema --print``, ``--help``) never open
    one. The broker is closed when the click context closes.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._broker: Broker | None = None

    @property
    def display_url(self) -> str:
        """The URL as it may be shown: any password replaced by ``***``."""
        return redact(self.url)

    def broker(self) -> Broker:
        """The broker for a command that writes (on SQLite the schema is created on first
        use, as the library does)."""
        if self._broker is None:
            self._broker = Broker(self.url)
        return self._broker

    def reader(self) -> Broker:
        """The broker for a read-only command: it never creates a database and never
        migrates one. A SQLite file that does not exist is an exit-2 error naming it (the
        usual cause is a missing ``--url`` or ``$SQLBROKER_URL``)."""
        if self._broker is None:
            parsed = parse_url(self.url)
            if parsed.scheme == "sqlite" and parsed.path not in (None, ":memory:"):
                path = Path(parsed.path or "")
                if not path.exists():
                    raise InvalidUsage(
                        f"no database at {path.absolute()}: pass --url or set SQLBROKER_URL"
                        " (a read-only command never creates one)"
                    )
            self._broker = Broker(self.url, migrate=False)
        return self._broker

    def close(self) -> None:
        broker, self._broker = self._broker, None
        if broker is not None:
            broker.close()


def pass_session(function: F) -> F:
    """Decorate a command callback to receive the :class:`Session` as its first argument."""
    return cast(F, click.pass_obj(function))


def cli_actor() -> str:
    """Who is acting, as recorded in the dead-letter audit trail: ``cli:<user>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def found_in(broker: Broker, subscription: str | None, found: T) -> T:
    """``found``, what a command found of ``subscription`` (``None``: of every one): rows,
    or a count. Nothing found of a name no subscription has is ``NotFound`` ("no
    subscription named …", exit 1), so that a typo does not read as an empty queue. The
    name is looked up only then (one read by key, never on the library's claim): the
    archive rows and dead letters a deleted subscription left still list."""
    if subscription is not None and not found:
        broker.retention(subscription)  # NotFound when there is no such subscription
    return found


def name_to_set(name: str | None, what: str) -> str:
    """The subscription NAME a command changes ``what`` of; a usage error (exit 2, with
    the pointer to ``--help``) when it was not given."""
    if name is None:
        raise click.UsageError(f"give the subscription NAME whose {what} to set")
    return name


def usage_failure(error: click.UsageError) -> click.ClickException:
    """A click usage error as one ``error: …`` line (exit 2) naming where help is; the
    help shown for a bare group (``sqlbroker dlq``) is left as it is."""
    if isinstance(error, click.exceptions.NoArgsIsHelpError):
        return error
    where = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
    return InvalidUsage(error.format_message() + where)


@contextlib.contextmanager
def listening(host: str, port: int) -> Iterator[None]:
    """Around binding a server socket: an address in use or not available is one line
    naming ``host:port``, exit 2 (choose another ``--port`` or ``--host``)."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        reason = {
            errno.EADDRINUSE: "the address is already in use",
            errno.EADDRNOTAVAIL: "the address is not available on this host",
            errno.EACCES: "permission denied",
        }[error.errno]
        raise InvalidUsage(
            f"cannot listen on {host}:{port}: {reason} (choose another --port or --host)"
        ) from None


class BrokerGroup(click.Group):
    """A click group that applies the CLI's error contract (see the module docstring) to
    every command below it."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as error:
            raise usage_failure(error) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            raise usage_failure(error) from None
        except (click.ClickException, click.exceptions.Exit):
            raise
        except (ValidationError, ConfigurationError) as error:
            raise InvalidUsage(str(error)) from None
        except SqlbrokerError as error:
            raise CliFailure(str(error)) from None
        except (KeyboardInterrupt, click.exceptions.Abort):
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except Exception as error:
            if os.environ.get(DEBUG_ENV):
                raise
            raise CliFailure(
                f"unexpected {type(error).__name__}: {error} (set {DEBUG_ENV}=1 for a traceback)"
            ) from None
