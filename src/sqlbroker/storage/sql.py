"""Named SQL blocks loaded once from a backend's ``.sql`` file.

A file holds blocks introduced by ``-- name: block_name``. The only substitution is
``{schema}``, replaced by an already-validated, quoted schema qualifier (or nothing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^-- include: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


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
    the block ``other`` (one level), so that two statements can share a long common part.
    ``other`` is a block of ``text`` or of ``shared`` (the blocks of the dialect's other
    files), so that one rule serves statements kept in two files."""
    blocks = _raw_blocks(text)
    known = {**(shared or {}), **blocks}

    def include(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in known:
            raise ValueError(f"-- include: of an unknown SQL block {name!r}")
        return known[name]

    return {name: _INCLUDE.sub(include, body) for name, body in blocks.items()}


def _read(package: str, filename: str) -> str:
    return resources.files(package).joinpath(filename).read_text(encoding="utf-8")


def load_blocks(package: str, filename: str, *, schema: str = "") -> dict[str, str]:
    blocks = parse_blocks(_read(package, filename))
    return {name: body.replace("{schema}", schema) for name, body in blocks.items()}


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
    return {name: body.replace("{schema}", schema) for name, body in blocks.items()}


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
