"""The "Transactional outbox" guide's examples are complete programs: run each one, on every
backend its ``# runs on:`` line names, exactly as printed in docs/outbox.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "outbox.md"
_BLOCK = re.compile(r"```python\n(# runs on: ([a-z, ]+)\n.*?)```", re.DOTALL)


def _examples() -> list[tuple[str, str, str]]:
    found = []
    heading = ""
    position = 0
    text = GUIDE.read_text(encoding="utf-8")
    for match in _BLOCK.finditer(text):
        headings = re.findall(r"^## (.+)$", text[position : match.start()], re.MULTILINE)
        heading = headings[-1] if headings else heading
        position = match.start()
        for backend in match.group(2).replace(" ", "").split(","):
            found.append((heading, backend, match.group(1)))
    return found


EXAMPLES = _examples()


def test_the_guide_has_examples_for_every_driver() -> None:
    assert {heading for heading, _, _ in EXAMPLES} >= {
        "sqlite3",
        "psycopg 3",
        "psycopg 3, asyncio",
        "SQLAlchemy",
        "Django",
        "FastAPI",
    }


@pytest.mark.parametrize(
    ("heading", "backend", "code"),
    [
        pytest.param(
            *example,
            id=f"{example[0]}-{example[1]}",
            marks=[pytest.mark.postgres] if example[1] == "postgresql" else [],
        )
        for example in EXAMPLES
    ],
)
def test_example_runs(
    heading: str, backend: str, code: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path}/outbox.db"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "SQLBROKER_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "one message" in result.stdout
