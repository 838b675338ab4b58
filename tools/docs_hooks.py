"""MkDocs hooks for the sqlbroker site (``mkdocs.yml`` loads this file).

The site's pages are the project's own Markdown, read where it lives so that nothing is
copied: the home page is ``README.md`` and the benchmark pages are ``bench/``'s, their
repository-relative links rewritten for the site. The API reference is generated from
``sqlbroker.__all__``, so a new public name appears there without an edit, and a public
name or member without a docstring is a warning, which ``mkdocs build --strict`` fails on.
"""

from __future__ import annotations

import enum
import inspect
import logging
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.plugins.sqlbroker_docs")

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def _sqlbroker() -> Any:
    """This tree's sqlbroker (as mkdocstrings' ``paths: [src]`` reads), not an installed one."""
    if sys.path[:1] != [str(SRC)]:
        sys.path.insert(0, str(SRC))
    import sqlbroker

    if not Path(sqlbroker.__file__).resolve().is_relative_to(SRC):
        log.warning("documenting %s, not this tree's src/", sqlbroker.__file__)
    return sqlbroker


# The API reference's sections, in order; a public name in none of them lands in "Other".
SECTIONS: list[tuple[str, list[str]]] = [
    ("Brokers", ["Broker", "AsyncBroker"]),
    ("Consuming", ["Worker", "Message", "Delivery", "WorkerCrashed", "Once", "KeyInProgress"]),
    ("Policies", ["RetryPolicy", "Retry", "Reject"]),
    (
        "Messages and inspection",
        [
            "Priority",
            "State",
            "Outcome",
            "ErrorInfo",
            "PendingMessage",
            "ArchivedMessage",
            "DeadLetter",
            "Subscription",
            "SubscriptionStats",
            "Result",
            "Retention",
        ],
    ),
    ("Schedules", ["Schedule", "Missed"]),
    (
        "Sagas",
        [
            "Saga",
            "Step",
            "StepContext",
            "SagaInstance",
            "SagaStep",
            "SagaStatus",
            "StepStatus",
            "SagaConflict",
            "SagaWarning",
        ],
    ),
    ("Clocks", ["Clock", "DatabaseClock", "ManualClock"]),
    ("Priorities", ["URGENT", "HIGH", "NORMAL", "LOW"]),
]
ERRORS_TITLE = "Errors"


def _api_page() -> str:
    sqlbroker = _sqlbroker()
    from sqlbroker.core.errors import SqlbrokerError

    names = [name for name in sqlbroker.__all__ if name != "__version__"]
    placed = {name for _, group in SECTIONS for name in group}
    errors = [
        name
        for name in names
        if name not in placed
        and isinstance(getattr(sqlbroker, name), type)
        and issubclass(getattr(sqlbroker, name), SqlbrokerError)
    ]
    other = [name for name in names if name not in placed and name not in errors]
    unknown = placed - set(names)
    if unknown:
        log.warning("API reference lists names not in sqlbroker.__all__: %s", sorted(unknown))
    lines = [
        "# API reference",
        "",
        "Everything `import sqlbroker` exports (`sqlbroker.__all__`), generated from the",
        "docstrings. Every error derives from `SqlbrokerError`; bad input raises a",
        "`ValidationError` subclass and writes nothing.",
        "",
    ]
    for title, group in [*SECTIONS, (ERRORS_TITLE, errors), ("Other", other)]:
        if not group:
            continue
        lines += [f"## {title}", ""]
        for name in group:
            if name not in names:
                continue
            obj = getattr(sqlbroker, name)
            if isinstance(obj, type) or callable(obj):
                lines += [f"::: sqlbroker.{name}", ""]
            else:  # a constant: griffe cannot follow tuple assignments, so state it here
                lines += [f"### `{name}`", "", f"`sqlbroker.{name} == {obj!r}`", ""]
    return "\n".join(lines)


def _own_doc(obj: Any) -> str | None:
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return doc.strip() if isinstance(doc, str) and doc.strip() else None


def _undocumented() -> list[str]:
    """Names in ``sqlbroker.__all__``, and their classes' public members, without a docstring."""
    sqlbroker = _sqlbroker()
    missing: list[str] = []
    for name in sqlbroker.__all__:
        obj = getattr(sqlbroker, name)
        if not isinstance(obj, type):
            continue
        doc = _own_doc(obj)
        if doc is None or doc.startswith(f"{obj.__name__}("):  # a dataclass's generated one
            missing.append(name)
        if issubclass(obj, enum.Enum):
            continue
        for member in dir(obj):
            if member.startswith("_"):
                continue
            for klass in obj.__mro__:
                if member in klass.__dict__:
                    break
            else:
                continue
            if not klass.__module__.startswith("sqlbroker"):
                continue
            raw = klass.__dict__[member]
            func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            if isinstance(func, property):
                func = func.fget
            if not (inspect.isfunction(func) or inspect.isdatadescriptor(raw)):
                continue
            if inspect.isdatadescriptor(raw) and not isinstance(raw, property):
                continue  # a slot or a field: documented in the class's docstring
            if _own_doc(func) is None:
                missing.append(f"{name}.{member} (in {klass.__module__}.{klass.__qualname__})")
    return missing


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the README as the home page, bench/'s Markdown and the generated API page."""
    files.append(File.generated(config, "index.md", content=_site_text(ROOT / "README.md", "")))
    for path in sorted((ROOT / "bench").rglob("*.md")):
        rel = path.relative_to(ROOT).as_posix()
        if ".peers-venv" in rel:
            continue
        files.append(File.generated(config, rel, content=_site_text(path, "bench/")))
    files.append(File.generated(config, "api.md", content=_api_page()))
    for problem in _undocumented():
        log.warning("public API without a docstring: %s", problem)
    return files


_LINK = re.compile(r"(\]\()(?!https?:|#|mailto:)([^)\s]+)")


def _site_text(path: Path, prefix: str) -> str:
    """The file's Markdown with repository-relative links made relative to its site page."""
    site_dir = prefix.rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        target = (Path(site_dir) / match.group(2)).as_posix() if site_dir else match.group(2)
        target = _normalise(target)
        if target.startswith("docs/"):
            target = target[len("docs/") :]
        depth = site_dir.count("/") + 1 if site_dir else 0
        return match.group(1) + "../" * depth + target

    return _LINK.sub(rewrite, path.read_text(encoding="utf-8"))


def _normalise(target: str) -> str:
    parts: list[str] = []
    for part in target.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """In docs/'s own pages, point ``../bench/...`` links at the site's copy of bench/."""
    if page.file.generated_by is None:
        depth = page.file.src_uri.count("/")
        outside, inside = "../" * (depth + 1), "../" * depth
        markdown = markdown.replace(f"]({outside}bench/", f"]({inside}bench/")
    return markdown
