"""Output: rich tables for people, JSON for scripts.

Everything that comes from the database (names, payloads, reasons) is wrapped in
:class:`rich.text.Text` before it is rendered, so ``[brackets]`` in user data are shown
as typed and never read as rich markup.

JSON output turns row dataclasses into objects: times as ISO 8601 strings in UTC, enums as
their values, and raw (non-JSON) payloads as base64 text; ``content_type`` tells which.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sqlbroker.core.serde import JSON_CONTENT_TYPE

# Piped output has no terminal width; let tables use a wide line rather than fold ids.
_PIPE_WIDTH = 200
_PREVIEW = 80


def console() -> Console:
    """A console on the current stdout (looked up at call time, so test runners work)."""
    out = Console(highlight=False)
    if not out.is_terminal:
        out.width = _PIPE_WIDTH
    return out


def cell(value: object) -> Text:
    """A table cell showing ``value`` literally; ``None`` shows as ``-``."""
    return Text("-" if value is None or value == "" else str(value))


def human_age(seconds: float | None) -> str:
    """A short age for tables: ``-`` (none), ``0.4s``, ``3.2s``, ``4m``, ``2.5h``, ``3.1d``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def human_time(moment: datetime | None) -> str:
    """A time in UTC to the second: ``2024-05-01 12:00:03Z``; ``-`` when absent."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def payload_preview(payload: Any, content_type: str, width: int = _PREVIEW) -> str:
    """One line describing a payload: compact JSON (shortened), or the size of raw bytes."""
    if content_type != JSON_CONTENT_TYPE or isinstance(payload, bytes | bytearray):
        return f"<{len(payload)} bytes {content_type}>"
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (see the module docstring for the mapping)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)
        }
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def echo_json(value: Any, *, compact: bool = False) -> None:
    """Print ``value`` as JSON on stdout: indented, or on one line when ``compact``."""
    data = jsonable(value)
    if compact:
        click.echo(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    else:
        click.echo(json.dumps(data, ensure_ascii=False, indent=2))


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    numeric: Iterable[str] = (),
) -> Table:
    """A table with ``columns`` (those named in ``numeric`` right-aligned) and literal cells."""
    right = set(numeric)
    result = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        result.add_column(
            name,
            justify="right" if name in right else "left",
            no_wrap=name in right or name == "id",
        )
    for row in rows:
        result.add_row(*(item if isinstance(item, Text) else cell(item) for item in row))
    return result


def print_table(result: Table, *, empty: str) -> None:
    """Print a table, or the dim ``empty`` note when it has no rows."""
    out = console()
    if result.row_count == 0:
        out.print(Text(empty, style="dim"))
    else:
        out.print(result)


def print_damaged(rows: Iterable[Any], *, key: str = "id") -> None:
    """After a listing: one line per row that did not decode (``row.damaged``), naming it
    by ``key`` and saying which columns are wrong (docs/security.md, "Damaged rows")."""
    out = console()
    for row in rows:
        if getattr(row, "damaged", None):
            out.print(cell(f"{key} {getattr(row, key)} is damaged: {row.damaged}"), style="bold")


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``1 dead letter``, ``2 dead letters``, ``2 deliveries``."""
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"
