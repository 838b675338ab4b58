"""Claims are decoded by position: both backends' claim statements return CLAIM_COLUMNS."""

from __future__ import annotations

import re

from sqlbroker.storage.rows import CLAIM_COLUMNS
from sqlbroker.storage.sql import load_blocks


def returned_columns(package: str) -> tuple[str, ...]:
    claim = load_blocks(package, "queries.sql", schema="")["message_claim"]
    returning = claim.rsplit("RETURNING", 1)[1]
    names = [part.strip().split(".")[-1] for part in returning.split(",")]
    return tuple(re.sub(r"::\w+$", "", name) for name in names)


def test_sqlite_claims_return_the_claim_columns_in_order() -> None:
    assert returned_columns("sqlbroker.storage.sqlite") == CLAIM_COLUMNS


def test_postgresql_claims_return_the_claim_columns_in_order() -> None:
    assert returned_columns("sqlbroker.storage.postgres") == CLAIM_COLUMNS
