"""Structured logs through stdlib logging.

sqlbroker logs with ``extra=`` fields (``subscription``, ``message_id``, ``delivery_id``,
``attempt``, ``worker``…) and never a payload. :class:`JsonFormatter` writes each record as
one JSON object per line with those fields at the top level; ``--log-format json`` on the
CLI installs it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

PLAIN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_FORMATS = ("plain", "json")

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the
    record's ``extra=`` fields, and ``exception`` with the formatted traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(level: str, *, fmt: str = "plain") -> None:
    """Show records at ``level`` and above on stderr, as plain lines or JSON.

    A handler the application installed on the root logger is kept (only the level is
    set), unless JSON is asked for, in which case its formatter becomes JSON.
    """
    root = logging.getLogger()
    root.setLevel(level.upper())
    formatter = JsonFormatter() if fmt == "json" else logging.Formatter(PLAIN_FORMAT)
    if not root.handlers:
        stream = logging.StreamHandler()
        stream.setFormatter(formatter)
        root.addHandler(stream)
    elif fmt == "json":
        for handler in root.handlers:
            handler.setFormatter(formatter)
