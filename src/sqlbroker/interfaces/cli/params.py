"""Command-line value types: durations, priorities, headers and payloads.

These only turn text into Python values. Range checks (a priority above 9, a negative
delay, an oversized payload) are left to the library, which applies them identically for
every caller and names the offending field.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from sqlbroker.core.errors import InvalidHeaders, InvalidPayload
from sqlbroker.core.message import Priority
from sqlbroker.core.serde import MAX_DEPTH

F = TypeVar("F", bound=Callable[..., Any])

_DURATION = re.compile(r"^\s*(?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class DurationType(click.ParamType):  # type: ignore[type-arg]
    """Seconds as a number (``1.5``) or with a unit: ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``.

    With ``positive``, zero and negative durations are refused as a usage error (for the
    CLI's own pacing options, which no library call checks); with ``non_negative``,
    negative ones (for an option checked before any library call, as the worker's grace
    is before its application is imported).
    """

    name = "duration"

    def __init__(self, *, positive: bool = False, non_negative: bool = False) -> None:
        self.positive = positive
        self.non_negative = non_negative

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        elif match := _DURATION.match(str(value)):
            seconds = float(match["number"]) * _UNIT_SECONDS[match["unit"] or "s"]
        else:
            self.fail(
                f"{value!r} is not a duration (seconds, or a number with ms/s/m/h/d)", param, ctx
            )
        if self.positive and seconds <= 0:
            self.fail(f"must be more than 0 seconds, not {value!r}", param, ctx)
        if self.non_negative and seconds < 0:
            self.fail(f"must not be negative, not {value!r}", param, ctx)
        return seconds


class PriorityType(click.ParamType):  # type: ignore[type-arg]
    """A priority: an integer (0 is the most urgent) or a name: urgent, high, normal, low."""

    name = "priority"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return int(Priority[text.upper()])
        except KeyError:
            names = ", ".join(p.name.lower() for p in Priority)
            self.fail(f"{value!r} is not a priority (an integer 0-9 or one of {names})", param, ctx)


DURATION = DurationType()
POSITIVE_DURATION = DurationType(positive=True)
NON_NEGATIVE_DURATION = DurationType(non_negative=True)
PRIORITY = PriorityType()
PORT = click.IntRange(min=0, max=65535)


def parse_headers(items: Iterable[str]) -> dict[str, str]:
    """``name=value`` strings as a mapping; a missing ``=`` or a repeated name is an error."""
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidHeaders("header", f"{item!r} is not name=value")
        if name in headers:
            raise InvalidHeaders("header", f"{name!r} is given more than once")
        headers[name] = value
    return headers


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json_payload(text: str) -> Any:
    """Parse JSON text strictly, naming the problem and where it is when it fails."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        # Far deeper than the library accepts: say so as the library would.
        raise InvalidPayload("payload", f"nests deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as error:
        raise InvalidPayload(
            "payload",
            f"is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
            " (quote strings, e.g. '\"hello\"', or use --raw to send the text as bytes)",
        ) from None
    except ValueError as error:
        raise InvalidPayload("payload", f"is not valid JSON: {error}") from None


def read_payload(argument: str, *, raw: bool) -> Any:
    """The payload named on the command line: ``-`` reads stdin. Without ``raw`` the text
    must be JSON and the parsed value is returned; with ``raw`` the bytes are returned as
    given (text arguments are encoded as UTF-8)."""
    if argument == "-":
        if raw:
            return sys.stdin.buffer.read()
        return parse_json_payload(sys.stdin.read())
    if raw:
        return argument.encode("utf-8", "surrogateescape")
    return parse_json_payload(argument)


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Several click decorators as one, applied as if written one above the other."""

    def apply(function: F) -> F:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


log_level_option = click.option(
    "--log-level",
    type=click.Choice(("debug", "info", "warning", "error", "critical"), case_sensitive=False),
    default="info",
)
"""``--log-level`` of the long-running commands (worker, scheduler), in any case."""

note_option = click.option("--note", metavar="TEXT", help="Why, recorded in the audit trail.")


def json_option(help_text: str = "Print JSON instead of a table.") -> Callable[[F], F]:
    """The ``--json`` flag of list-like commands, passed to the callback as ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)
