"""A rule that differs between the dialects reads a capability flag of the dialect's
``Settings`` (``array_params``, ``writes_in_with``, …), never the dialect's name: a plan is
written once and a dialect supplies only its SQL, its encodings and its flags (DESIGN.md §4)."""

from __future__ import annotations

import re
from pathlib import Path

import sqlbroker

PACKAGE = Path(sqlbroker.__file__).parent
NAMES_A_DIALECT = re.compile(r"\.dialect\b")


def test_no_plan_names_a_dialect() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for folder in ("storage/operations", "client")
        for path in sorted((PACKAGE / folder).glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if NAMES_A_DIALECT.search(line)
    ]
    assert found == [], "plans that test the dialect's name:\n" + "\n".join(found)
