"""Named SQL blocks loaded once from a backend's ``.sql`` file.

A file holds blocks introduced by ``-- name: block_name``. The only substitution is
``{schema}``, replaced by an already-validated, quoted schema qualifier (or nothing). A
loaded block carries no comments, blank lines or indentation (:func:`compact`): psycopg
caches its parsing of a statement's text only up to 4,096 bytes, and the comments of the
longest blocks are most of their length.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^-- include: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


_CODE_END = re.compile(r"--|/\*|'|\"|\$")
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")
_IDENTIFIER_CHAR = re.compile(r"[A-Za-z0-9_$]")
_LAYOUT = re.compile(r"[ \t]*\n\s*")


def compact(sql: str) -> str:
    """``sql`` without its comments (``-- …`` and ``/* … */``, not nested), its lines
    without indentation or trailing blanks, and no empty line; the text of string literals
    (``'…'``, ``E'…'``), quoted identifiers (``"…"``) and dollar-quoted bodies
    (``$$…$$``, ``$tag$…$tag$``) is kept exactly, a ``--`` in them included."""
    parts: list[str] = []
    code: list[str] = []  # the code since the last literal, comments removed
    position = 0

    def literal(start: int, end: int) -> None:
        parts.append(_LAYOUT.sub("\n", "".join(code)))
        code.clear()
        parts.append(sql[start:end])

    while (found := _CODE_END.search(sql, position)) is not None:
        start = found.start()
        code.append(sql[position:start])
        token = found.group()
        if token == "--":
            end = sql.find("\n", start)
            position = len(sql) if end < 0 else end
        elif token == "/*":
            end = sql.find("*/", start + 2)
            if end < 0:
                raise ValueError("SQL block comment without its end")
            position = end + 2
            code.append(" ")
        elif token == "$":
            tag = _DOLLAR_TAG.match(sql, start)
            if tag is None or (start and _IDENTIFIER_CHAR.match(sql[start - 1])):
                code.append("$")  # a parameter ($1) or part of an identifier
                position = start + 1
                continue
            end = sql.find(tag.group(), tag.end())
            if end < 0:
                raise ValueError(f"SQL dollar-quoted body without its closing {tag.group()}")
            position = end + len(tag.group())
            literal(start, position)
        else:
            escapes = token == "'" and _escape_prefix(sql, start)
            end = start + 1
            while True:
                end = sql.find(token, end)
                if end < 0:
                    raise ValueError(f"SQL literal without its closing {token}")
                if escapes and _escaped(sql, end):
                    end += 1
                    continue
                break
            position = end + 1
            literal(start, position)
    code.append(sql[position:])
    parts.append(_LAYOUT.sub("\n", "".join(code)))
    return "".join(parts).strip()


def _escape_prefix(sql: str, start: int) -> bool:
    """Whether the string literal at ``start`` is PostgreSQL's ``E'…'`` (backslashes
    escape)."""
    return (
        start > 0
        and sql[start - 1] in "Ee"
        and (start == 1 or not _IDENTIFIER_CHAR.match(sql[start - 2]))
    )


def _escaped(sql: str, index: int) -> bool:
    """Whether the character at ``index`` follows an odd number of backslashes."""
    backslashes = 0
    while sql[index - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _raw_blocks(text: str) -> dict[str, str]:
    """The blocks of ``text`` by name, their includes not yet replaced."""
    blocks: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match.group(1)
        if name in blocks:
            raise ValueError(f"duplicate SQL block {name!r}")
        blocks[name] = text[match.end() : end].strip()
    return blocks


def parse_blocks(text: str, *, shared: Mapping[str, str] | None = None) -> dict[str, str]:
    """Split ``text`` into named blocks; a line ``-- include: other`` stands for the text of
    the block ``other`` (its own includes replaced too), so that two statements can share a
    long common part.
    ``other`` is a block of ``text`` or of ``shared`` (the blocks of the dialect's other
    files), so that one rule serves statements kept in two files."""
    blocks = _raw_blocks(text)
    known = {**(shared or {}), **blocks}

    def expand(body: str, within: tuple[str, ...]) -> str:
        def include(found: re.Match[str]) -> str:
            name = found.group(1)
            if name not in known:
                raise ValueError(f"-- include: of an unknown SQL block {name!r}")
            if name in within:
                raise ValueError(f"-- include: of SQL block {name!r} within itself")
            return expand(known[name], (*within, name))

        return _INCLUDE.sub(include, body)

    return {name: expand(body, (name,)) for name, body in blocks.items()}


def _read(package: str, filename: str) -> str:
    return resources.files(package).joinpath(filename).read_text(encoding="utf-8")


def load_blocks(package: str, filename: str, *, schema: str = "") -> dict[str, str]:
    blocks = parse_blocks(_read(package, filename))
    return {name: compact(body).replace("{schema}", schema) for name, body in blocks.items()}


def load_sql(package: str, *, schema: str = "") -> dict[str, str]:
    """The blocks of every ``.sql`` file of a dialect's package (its queries, then one file
    per operation group; migrations live in a subpackage and are not blocks); a block name
    may appear in only one of them, and a block may include a block of another file."""
    files = sorted(entry.name for entry in resources.files(package).iterdir())
    texts = [(name, _read(package, name)) for name in files if name.endswith(".sql")]
    raw: dict[str, str] = {}
    for filename, text in texts:
        for name, body in _raw_blocks(text).items():
            if name in raw:
                raise ValueError(f"SQL block {name!r} of {filename} is defined twice")
            raw[name] = body
    blocks: dict[str, str] = {}
    for _, text in texts:
        blocks.update(parse_blocks(text, shared=raw))
    return {name: compact(body).replace("{schema}", schema) for name, body in blocks.items()}


def load_migrations(package: str, *, schema: str = "") -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` for each ``NNNN_name.sql`` in the package, in order."""
    found = []
    for entry in resources.files(package).iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            sql = entry.read_text(encoding="utf-8").replace("{schema}", schema)
            found.append((int(match.group(1)), match.group(2), sql))
    found.sort()
    versions = [version for version, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migrations in {package} are not numbered 1..n: {versions}")
    return found


def printed_schema(
    migrations: Sequence[tuple[int, str, str]],
    *,
    backend: str,
    version_table: str,
    version_row: str,
    preamble: Sequence[str] = (),
) -> str:
    """The whole schema as one script a DBA (or an Alembic/Django migration) applies by
    hand: every migration under a comment naming it, each followed by its row in the
    versions table, so that the broker accepts the database and ``migrate`` finds nothing
    left to do. ``version_row`` is a block with ``{version}`` and ``{name}`` markers."""
    latest = migrations[-1][0] if migrations else 0
    parts = [
        f"-- sqlbroker schema, version {latest} ({backend}): migrations 1 to {latest} and"
        " their rows in\n-- sqlbroker_schema_version. Apply it once to an empty database;"
        " `sqlbroker migrate`\n-- then has nothing to do.",
        *preamble,
        version_table.rstrip().rstrip(";") + ";",
    ]
    for version, name, script in migrations:
        # Both come from the file name, which load_migrations matched: digits, [a-z0-9_].
        row = version_row.replace("{version}", str(int(version))).replace("{name}", name)
        parts.append(f"-- migration {version:04d}_{name} (schema version {version})")
        parts.append(script.strip())
        parts.append(row.rstrip().rstrip(";") + ";")
    return "\n\n".join(parts) + "\n"
