"""Loaded SQL blocks carry no comments or layout (storage/sql.py ``compact``): psycopg
parses a statement's text once and caches it only up to 4,096 bytes, so the comments of
the hot statements cost a parse on every call. Literals keep their text, ``--`` included."""

from __future__ import annotations

import sqlite3

import pytest

from sqlbroker.storage.sql import compact, load_sql, parse_blocks

MAX_CACHED = 4096
"""psycopg's MAX_CACHED_STATEMENT_LENGTH (psycopg/_queries.py)."""


def test_comments_and_layout_go() -> None:
    text = """
    -- what the statement does
    SELECT a,   -- the first column
           b    /* the second */ , c

           -- and why
    FROM t
    """
    assert compact(text) == "SELECT a,\nb      , c\nFROM t"


@pytest.mark.parametrize(
    "literal",
    [
        "'a -- b'",
        "'it''s -- /* here */'",
        "E'it\\'s -- here\\\\'",
        '"odd -- name"',
        "$$ -- a body\n  /* kept */ $$",
        "$grant$ RAISE 'x -- y'; $body$ $grant$",
        "'line one\n   -- line two\n'",
    ],
)
def test_literals_keep_their_text(literal: str) -> None:
    assert compact(f"SELECT {literal} -- gone\n  FROM t") == f"SELECT {literal}\nFROM t"


def test_parameters_and_identifiers_with_a_dollar_stay() -> None:
    assert compact("SELECT $1, a$b$ -- c\nFROM t") == "SELECT $1, a$b$\nFROM t"


@pytest.mark.parametrize("text", ["SELECT 'open", 'SELECT "open', "SELECT $$ open", "/* open"])
def test_an_unclosed_literal_or_comment_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="without"):
        compact(text)


def test_sqlite_reads_a_compacted_literal_as_written() -> None:
    sql = compact("SELECT 'a -- b', 'c /* d */' -- e\n, \"x--y\" FROM (SELECT 1 AS \"x--y\")")
    assert sqlite3.connect(":memory:").execute(sql).fetchone() == ("a -- b", "c /* d */", 1)


def test_directives_still_work() -> None:
    text = "-- name: one\n-- a comment\nSELECT 1\n-- include: two\n-- name: two\nFROM t -- x\n"
    blocks = {name: compact(body) for name, body in parse_blocks(text).items()}
    assert blocks == {"one": "SELECT 1\nFROM t", "two": "FROM t"}


@pytest.mark.parametrize("package", ["sqlbroker.storage.sqlite", "sqlbroker.storage.postgres"])
def test_the_hot_statements_fit_psycopgs_cache(package: str) -> None:
    blocks = load_sql(package)
    for name in ("message_insert_one", "message_claim", "message_settle", "message_complete"):
        if name in blocks:
            body = blocks[name]
            assert len(body.encode()) <= MAX_CACHED, name
            assert not any(part in body for part in ("--", "\n\n", "\n ")), name
