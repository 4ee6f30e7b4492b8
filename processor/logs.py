"""Structured JSON log lines on stderr.

A line carries the message, level, logger and any ``extra=`` fields (turn
and correlation ids). Update text is user data: it is never passed to a log
call. Anything that looks like a Redis URL has its password masked.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)))
_URL_PASSWORD = re.compile(r"(rediss?://[^:/@\s]*:)[^@\s]+@")


def redact_text(text: str) -> str:
    """Mask passwords inside any Redis URL in ``text``."""
    return _URL_PASSWORD.sub(r"\1***@", text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return redact_text(json.dumps(line, default=str))


def setup(level: str = "info") -> None:
    """Send the ``processor`` loggers to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("processor")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    logging.Formatter.converter = time.gmtime
