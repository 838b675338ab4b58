"""Output: rich tables for people, JSON for scripts.

Everything that comes from the database (names, payloads, reasons) is wrapped in
:class:`rich.text.Text` before it is rendered, so ``[brackets]`` in user data are shown
as typed and never read as rich markup, and passes through :func:`escape_controls`, so a
stored terminal escape sequence (``\x1b[2J``, a C1 control, a bidi override) is shown as
its escape and never acted on by the terminal. This module is the one place that does it.

JSON output turns row dataclasses into objects: times as ISO 8601 strings in UTC, enums as
their values, raw (non-JSON) payloads as base64 text (``content_type`` tells which) and
non-finite floats as ``null``: :func:`sqlbroker.core.serde.jsonable`, shared with the dashboard.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich.cells import cell_len
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.table import Table
from rich.text import Text

from sqlbroker.core.serde import JSON_CONTENT_TYPE, jsonable, raw_preview

# Piped output has no terminal width; let tables use a wide line rather than fold ids.
_PIPE_WIDTH = 200
_PREVIEW = 80


def console() -> Console:
    """A console on the current stdout (looked up at call time, so test runners work).

    Its width is the terminal's, or ``$COLUMNS`` when set; piped output without
    ``$COLUMNS`` gets a wide line."""
    out = Console(highlight=False)
    if not out.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        out.width = _PIPE_WIDTH
    return out


# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides and
# isolates that reorder what a terminal shows ("Trojan Source").
_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
_LINE_BREAKS = re.compile(r"[\n\t]")
# What json.dumps leaves unescaped of the above (it escapes the C0 controls itself).
_JSON_CONTROLS = re.compile(rf"[\x7f-\x9f{_BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, *, multiline: bool = False) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``, ``\\u202e``):
    the only form in which stored text reaches the terminal. Tabs and newlines are kept
    when ``multiline`` (a traceback), else escaped too (a table cell is one line)."""
    text = _CONTROLS.sub(_escape, text)
    return text if multiline else _LINE_BREAKS.sub(_escape, text)


def literal(text: str, *, multiline: bool = False, style: str = "") -> Text:
    """Stored text as a rich ``Text``: no markup, control characters escaped."""
    return Text(escape_controls(text, multiline=multiline), style=style)


def cell(value: object) -> Text:
    """A table cell showing ``value`` literally; ``None`` shows as ``-``."""
    return literal("-" if value is None or value == "" else str(value))


def json_text(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON text safe for a terminal: non-ASCII kept, every control escaped
    (``\\u009b`` is the same JSON string as the raw character)."""
    separators = None if indent else (",", ":")
    text = json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)
    return _JSON_CONTROLS.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def json_view(value: Any) -> Text:
    """``value`` as indented, highlighted JSON for a terminal (see :func:`json_text`)."""
    return JSONHighlighter()(Text(json_text(value, indent=2)))


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


def payload_preview(payload: Any, content_type: str) -> str:
    """One line describing a payload: compact JSON (shortened), or the size of raw bytes."""
    if content_type != JSON_CONTENT_TYPE or isinstance(payload, bytes | bytearray):
        return raw_preview(payload, content_type)
    text = json_text(payload)
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def echo_json(value: Any, *, compact: bool = False) -> None:
    """Print ``value`` as JSON on stdout: indented, or on one line when ``compact``."""
    click.echo(json_text(jsonable(value), indent=None if compact else 2))


# A rich table with a box spends 3 characters per column and 1 more on borders and padding.
_COLUMN_OVERHEAD = 3
_KEY_MIN_WIDTH = 24


def _natural_width(text: Text) -> int:
    return max((cell_len(line) for line in text.plain.split("\n")), default=0)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    numeric: Iterable[str] = (),
    key: str | None = None,
    drop: Sequence[str] = (),
) -> Table:
    """A table with ``columns`` (those named in ``numeric`` right-aligned) and literal cells,
    made to fit the console's width so that it stays readable in an 80-column
    terminal: while the rows would need more than that width unwrapped, the columns named in
    ``drop`` are left out, least important first, and a dim caption names them. The
    ``key`` column (default: the first) is never dropped nor squeezed below a readable
    width; what still does not fit wraps inside its cell."""
    right = set(numeric)
    key = key or columns[0]
    body = [[item if isinstance(item, Text) else cell(item) for item in row] for row in rows]
    widths = {
        name: max([cell_len(name), *(_natural_width(row[index]) for row in body)])
        for index, name in enumerate(columns)
    }
    available = console().width
    shown = list(columns)
    hidden: list[str] = []
    for name in drop:
        if sum(widths[c] for c in shown) + _COLUMN_OVERHEAD * len(shown) + 1 <= available:
            break
        if name in shown and name != key:
            shown.remove(name)
            hidden.append(name)
    caption = (
        f"not shown at {available} columns: {', '.join(hidden)} (--json has every field)"
        if hidden and body
        else None
    )
    result = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        caption=caption,
        caption_justify="left",
        caption_style="dim",
    )
    for name in shown:
        result.add_column(
            name,
            justify="right" if name in right else "left",
            no_wrap=name in right or name == "id",
            min_width=min(widths[name], _KEY_MIN_WIDTH) if name == key else None,
        )
    positions = [columns.index(name) for name in shown]
    for row in body:
        result.add_row(*(row[index] for index in positions))
    return result


def print_table(result: Table, *, empty: str) -> None:
    """Print a table, or the dim ``empty`` note when it has no rows."""
    out = console()
    if result.row_count == 0:
        out.print(Text(empty, style="dim"))
    else:
        out.print(result)


def table_of(
    title: str | None,
    rows: Iterable[Any],
    columns: Mapping[str, Callable[[Any], object]],
    **fit: Any,
) -> Table:
    """A :func:`table` of ``rows`` whose ``columns`` map each heading to a row's value."""
    body = [[value(row) for value in columns.values()] for row in rows]
    return table(title, list(columns), body, **fit)


def listing(
    rows: Sequence[Any],
    columns: Mapping[str, Callable[[Any], object]],
    *,
    as_json: bool,
    empty: str,
    title: str | None = None,
    damaged: str | None = "id",
    **fit: Any,
) -> None:
    """Print ``rows`` as JSON, or as a :func:`table` whose ``columns`` map each heading to
    the value of a row (``fit``: ``numeric``, ``key``, ``drop``), then name the damaged
    rows by their ``damaged`` field (``None``: rows that cannot be damaged)."""
    if as_json:
        echo_json(rows)
        return
    print_table(table_of(title, rows, columns, **fit), empty=empty)
    if damaged is not None:
        print_damaged(rows, key=damaged)


def fields(pairs: Iterable[tuple[str, object]]) -> Table:
    """A borderless two-column grid: each field's name in bold, then its value literally."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for name, value in pairs:
        grid.add_row(name, cell(value))
    return grid


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
