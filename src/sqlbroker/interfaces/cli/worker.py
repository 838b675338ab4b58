"""``sqlbroker worker``: run the subscribers an application declares, until stopped.

The application is named like uvicorn and celery name theirs, ``package.module:attribute``,
and imported with the current directory on ``sys.path``. The worker uses that broker, and
so that broker's database: the group's ``--url`` does not apply.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import traceback

import click
from click.core import ParameterSource

from sqlbroker.app import Broker
from sqlbroker.interfaces import logs
from sqlbroker.interfaces.cli.observe import observe_options, serve_worker_metrics
from sqlbroker.interfaces.cli.params import NON_NEGATIVE_DURATION, log_level_option
from sqlbroker.interfaces.cli.session import DEBUG_ENV, CliFailure, InvalidUsage
from sqlbroker.runtime.worker import WorkerCrashed

DEFAULT_ATTRIBUTE = "broker"
DEFAULT_GRACE = 30.0

_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")

log = logging.getLogger("sqlbroker.cli")


def _file_hint(module_name: str) -> str:
    """For an APP named by its file (``shop.py``, ``src/shop.py``): name the module
    (``shop:broker``), from the file's directory; ``""`` for any other name."""
    if not (module_name.endswith(".py") or "/" in module_name or os.sep in module_name):
        return ""
    directory, file = os.path.split(module_name)
    where = f", run from {directory}" if directory else ""
    return f"; name the module, not its file: {file.removesuffix('.py')}:broker{where}"


def _split_reference(reference: str) -> tuple[str, str]:
    """``package.module:attribute`` as its two halves; the attribute defaults to ``broker``."""
    module_name, _, attribute = reference.partition(":")
    attribute = attribute or DEFAULT_ATTRIBUTE
    if not _DOTTED.match(module_name) or not _DOTTED.match(attribute):
        raise InvalidUsage(
            f"APP must look like package.module:attribute, not {reference!r}"
            f"{_file_hint(module_name)}"
        )
    return module_name, attribute


def _where(error: BaseException) -> str:
    """`` at file:line`` where ``error`` was raised in the application's code, or ``""``."""
    if isinstance(error, SyntaxError) and error.filename and error.lineno:
        return f" at {os.path.relpath(error.filename)}:{error.lineno}"
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<")
    ]
    if not frames:
        return ""
    return f" at {os.path.relpath(frames[-1].filename)}:{frames[-1].lineno}"


def _import(module_name: str) -> object:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except Exception as error:
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise InvalidUsage(
                f"cannot import {module_name!r}: no module named {missing!r}"
                f" (looked in {os.getcwd()} and on sys.path){_file_hint(module_name)}"
            ) from None
        if os.environ.get(DEBUG_ENV):
            raise
        raise CliFailure(
            f"importing {module_name!r} failed{_where(error)}: {type(error).__name__}: {error}"
            f" (set {DEBUG_ENV}=1 for a traceback)"
        ) from None


def load_broker(reference: str) -> Broker:
    """Import the :class:`~sqlbroker.Broker` that ``reference`` names, with its subscribers.

    Raises :class:`InvalidUsage` (exit 2) when the reference is malformed, the module or
    attribute does not exist, or the attribute is not a ``Broker``; :class:`CliFailure`
    (exit 1) when importing the module raised.
    """
    module_name, attribute = _split_reference(reference)
    module = _import(module_name)
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            brokers = sorted(
                name for name, value in vars(module).items() if isinstance(value, Broker)
            )
            hint = f" (Broker instances there: {', '.join(brokers)})" if brokers else ""
            raise InvalidUsage(f"module {module_name!r} has no attribute {attribute!r}{hint}")
        target = getattr(target, part)
    if not isinstance(target, Broker):
        raise InvalidUsage(
            f"{module_name}:{attribute} is a {type(target).__name__}, not a sqlbroker.Broker"
        )
    return target


@click.command()
@click.argument("app", metavar="APP")
@click.option(
    "--subscription",
    "subscriptions",
    multiple=True,
    metavar="NAME",
    help="Run only this subscriber (repeatable). [default: all of them]",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=10_000),
    metavar="N",
    help="Handlers running at once per subscription. [default: each subscriber's own]",
)
@click.option(
    "--grace",
    type=NON_NEGATIVE_DURATION,
    default=DEFAULT_GRACE,
    metavar="SECONDS",
    help="On stop, how long running handlers may take to finish (30, 2m).",
)
@log_level_option
@click.option(
    "--schedules/--no-schedules",
    default=True,
    help="Also publish the due ticks of durable schedules.",
)
@observe_options
@click.pass_context
def worker(
    ctx: click.Context,
    app: str,
    subscriptions: tuple[str, ...],
    concurrency: int | None,
    grace: float,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    schedules: bool,
) -> None:
    """Run the subscribers of an application's broker until stopped.

    APP names a sqlbroker.Broker as package.module:attribute (the attribute defaults to
    "broker"), imported with the current directory on sys.path. The worker uses that
    broker and so its database URL: the global --url option and $SQLBROKER_URL do not
    apply to this command.

    SIGTERM or Ctrl-C stops gracefully: nothing new is claimed, running handlers get
    --grace seconds to finish and every outcome is written back; a second signal stops
    at once. Exits 0 after a stop, 1 if the worker crashed, 2 if APP or an option is wrong.

    \b
    Example:
      sqlbroker worker shop.tasks:broker --subscription emails --concurrency 20
    """
    broker = load_broker(app)
    if not broker.subscribers:
        raise InvalidUsage(
            f"{app} has no subscribers: declare some with @broker.subscriber(...) in the"
            " module, or in modules it imports"
        )
    unknown = [name for name in subscriptions if name not in broker.subscribers]
    if unknown:
        raise InvalidUsage(
            f"no subscriber named {', '.join(map(repr, unknown))} in {app}"
            f" (registered: {', '.join(broker.subscribers)})"
        )
    if ctx.find_root().get_parameter_source("url") is ParameterSource.COMMANDLINE:
        click.echo(
            f"warning: --url is ignored by the worker: it uses the database of {app}",
            err=True,
        )
    logs.configure(log_level, fmt=log_format)
    if metrics_port is not None:
        serve_worker_metrics(broker, port=metrics_port, host=metrics_host)
    chosen = list(dict.fromkeys(subscriptions)) or None
    log.info(
        "starting %s on %s: %s",
        app,
        broker.url,
        ", ".join(chosen or broker.subscribers),
    )
    try:
        broker.run(subscriptions=chosen, concurrency=concurrency, grace=grace, schedules=schedules)
    except WorkerCrashed as error:
        raise CliFailure(str(error)) from None
    finally:
        broker.close()
