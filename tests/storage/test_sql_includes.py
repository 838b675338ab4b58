"""A block may include a block of another file of its dialect, so that one rule serves
statements kept in two files: the plain claim (queries.sql) and the flow claim (flow.sql)
share the lease and attempt a claim gives (``message_claim_lease``)."""

from __future__ import annotations

import pytest

from sqlbroker.storage.sql import load_blocks, load_sql, parse_blocks

TEXT = """
-- name: first
SELECT 1
-- include: shared_part

-- name: second
-- include: first
"""


def test_an_include_takes_a_block_of_this_file_or_of_the_shared_ones() -> None:
    blocks = parse_blocks(TEXT, shared={"shared_part": "FROM elsewhere"})
    assert blocks["first"] == "SELECT 1\nFROM elsewhere"
    assert blocks["second"] == "SELECT 1\nFROM elsewhere"  # its include's includes too


def test_an_include_of_a_block_within_itself_is_refused() -> None:
    with pytest.raises(ValueError, match="within itself"):
        parse_blocks("-- name: a\n-- include: b\n-- name: b\n-- include: a\n")


def test_an_include_of_an_unknown_block_is_refused() -> None:
    with pytest.raises(ValueError, match="shared_part"):
        parse_blocks(TEXT)


@pytest.mark.parametrize("package", ["sqlbroker.storage.sqlite", "sqlbroker.storage.postgres"])
def test_both_claims_give_the_lease_of_one_block(package: str) -> None:
    blocks = load_sql(package)
    lease = blocks["message_claim_lease"]
    assert "lease_token" in lease
    assert lease in blocks["message_claim"]
    assert lease in blocks["message_claim_flow"]
    assert not any("-- include:" in body for body in blocks.values())


@pytest.mark.parametrize("package", ["sqlbroker.storage.sqlite", "sqlbroker.storage.postgres"])
def test_queries_sql_loads_on_its_own(package: str) -> None:
    """The schema printer and the Spark plugin load ``queries.sql`` alone: a fragment that
    blocks of both files include (``gone_archived``, ``archive_copies``,
    ``leases_given``) lives there."""
    alone = load_blocks(package, "queries.sql")
    every = load_sql(package)
    assert all(alone[name] == every[name] for name in alone)
