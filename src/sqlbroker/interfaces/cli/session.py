"""What every command shares: the lazily opened broker and the translation of failures.

Contract of the whole CLI, enforced here once:

- an ``SqlbrokerError`` becomes one red ``error: …`` line on stderr and exit code 2 for a
  ``ValidationError`` (bad input, nothing written) or 1 for anything else;
- Ctrl-C (or an interrupted prompt) exits 130 without a traceback;
- any other exception is reported the same way with exit code 1, unless
  ``SQLBROKER_DEBUG`` is set, in which case it propagates with its traceback;
- every message that reaches the terminal passes through :func:`redact`, so a DSN
  password is never printed.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from typing import IO, Any, TypeVar, cast

import click

from sqlbroker.app import Broker
from sqlbroker.core.errors import SqlbrokerError, ValidationError
from sqlbroker.storage.url import redact

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEBUG_ENV = "SQLBROKER_DEBUG"

F = TypeVar("F", bound=Callable[..., Any])


class CliFailure(click.ClickException):
    """A failure reported as a single red ``error: …`` line on stderr, exit code 1.

    The message is redacted and folded onto one line.
    """

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(redact(message).split()))

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
        if self._broker is None:
            self._broker = Broker(self.url)
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


def failure_for(error: SqlbrokerError) -> CliFailure:
    """The CLI failure for a library error: exit 2 for invalid input, else 1."""
    return (
        InvalidUsage(str(error)) if isinstance(error, ValidationError) else CliFailure(str(error))
    )


class BrokerGroup(click.Group):
    """A click group that applies the CLI's error contract (see the module docstring) to
    every command below it."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit):
            raise
        except SqlbrokerError as error:
            raise failure_for(error) from None
        except (KeyboardInterrupt, click.exceptions.Abort):
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except Exception as error:
            if os.environ.get(DEBUG_ENV):
                raise
            raise CliFailure(
                f"unexpected {type(error).__name__}: {error} (set {DEBUG_ENV}=1 for a traceback)"
            ) from None
