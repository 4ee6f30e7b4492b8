"""Log lines on stderr: structured JSON, or one human line each on a terminal.

A line carries ts, level, logger, msg and any ``extra=`` fields (turn and
correlation ids, shard, counts). ``--log-format`` chooses: ``json`` (one
object a line, for log collectors), ``text`` (``12:00:01 warning redis
unreachable, retrying (url=..., error=...)``, for a person) or ``auto``,
the default: text when stderr is a terminal, JSON otherwise (a container's
log, a pipe, a file). Update text is user data: it is never
passed to a log call, except the merged text of a published turn when the
debug flag ``--log-payloads`` is on (``turn_fields``). Anything that
looks like a Redis URL has its password masked, and anything that looks
like a turn token (``v1.<payload>.<mac>``, processor/serve/tokens.py) is
cut to ``v1.***``, whatever logger wrote it. With ``libraries=True``
(``processor serve``) the lines of every other library (aiohttp, asyncio,
warnings) come in the same format, one line each, without their exception
text: aiohttp's error lines quote the raw request, whose URL or headers
may hold a token.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import msgspec

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)))
# The userinfo password up to the last "@" of the authority (a password may
# hold "@"), and a password given as a query parameter.
_URL_PASSWORD = re.compile(r"((?:rediss?|unix)://[^:/@\s\"]*:)[^\s/\"]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s\"]+")
# A token: "v1.", its base64url payload and MAC (or what is left of them).
_TOKEN = re.compile(r"v1\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")
_unpack = msgspec.msgpack.Decoder()

_payloads = False


def redact_text(text: str) -> str:
    """Mask passwords inside any Redis URL in ``text``, and turn tokens."""
    text = _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
    return _TOKEN.sub("v1.***", text)


def iso_utc(seconds: float) -> str:
    """A Unix time as ISO 8601 UTC to the millisecond: ``2026-11-26T08:05:40.123Z``."""
    whole, ms = divmod(int(seconds * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (ISO 8601 UTC), level, logger, msg, then the extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": iso_utc(record.created),
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


class LibraryLines(logging.Filter):
    """A line of a library (not a ``processor`` logger): its exception goes
    as its class name only (``error``), never its text or traceback; and at
    most one line of a kind (logger, level, message template, error class)
    per ``every`` seconds, the next one carrying how many were left out
    (``suppressed``). Any client can make aiohttp write an error line (one
    per malformed request): without the bound, a client floods the log."""

    #: Kinds remembered at most (the oldest forgotten first).
    KINDS = 1024

    def __init__(self, every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every, self.clock = every, clock
        self._kinds: dict[tuple[Any, ...], list[float]] = {}  # kind -> [logged at, left out]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("processor"):
            return True
        error = record.exc_info[1] if record.exc_info else None
        if record.exc_info:
            record.__dict__["error"] = type(error).__name__ if error else None
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        kind = (record.name, record.levelno, str(record.msg).split(" from ")[0],
                type(error).__name__ if error else None)
        now, seen = self.clock(), self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.every:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.__dict__["suppressed"] = int(seen[1])
        self._kinds.pop(kind, None)
        self._kinds[kind] = [now, 0]
        if len(self._kinds) > self.KINDS:
            del self._kinds[next(iter(self._kinds))]
        return True


class TextFormatter(logging.Formatter):
    """One line for a person: local time, level, message, then the extras as
    ``key=value`` in parentheses (and a traceback's lines after it, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname.lower()} {record.getMessage()}"
        extras = [f"{key}={value}" for key, value in vars(record).items()
                  if key not in _STANDARD and not key.startswith("_")]
        if extras:
            line += f" ({', '.join(extras)})"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact_text(line)


#: The values of ``--log-format``.
FORMATS = ("auto", "json", "text")


def formatter(fmt: str, stream: TextIO) -> logging.Formatter:
    """The formatter ``--log-format`` names; ``auto`` is text on a terminal, else JSON."""
    if fmt == "auto":
        fmt = "text" if _isatty(stream) else "json"
    return TextFormatter() if fmt == "text" else JsonFormatter()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file
        return False


def setup(level: str = "info", payloads: bool = False, stream: TextIO | None = None,
          fmt: str = "auto", libraries: bool = False) -> None:
    """Send the ``processor`` loggers to stderr (JSON lines, or text on a
    terminal: ``formatter``); ``payloads`` lets published turns' text
    into debug lines (``--log-payloads``); ``libraries``: every other
    logger's lines too, in the same format (``LibraryLines``), and
    Python's warnings."""
    global _payloads
    _payloads = payloads
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(fmt, stream))
    root = logging.getLogger("processor")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    logging.Formatter.converter = time.gmtime
    if libraries:
        others = logging.StreamHandler(stream)
        others.setFormatter(formatter(fmt, stream))
        others.addFilter(LibraryLines())
        logging.root.handlers[:] = [others]
        logging.root.setLevel(level.upper())
        logging.captureWarnings(True)


def set_payloads(enabled: bool) -> None:
    global _payloads
    _payloads = enabled


def turn_fields(outputs: bytes) -> dict[str, Any]:
    """Log fields of a published turn from its ``finalise_turns`` outputs
    (msgpack [merged entry fields, terminal event fields]): ids, correlation
    ids and counts; its merged text only with ``--log-payloads``."""
    merged, terminal = (_pairs(fields) for fields in _unpack.decode(outputs))
    meta = json.loads(merged.get("meta", "{}"))
    out: dict[str, Any] = {
        "response_id": merged.get("response_id"),
        "synthesis_id": merged.get("synthesis_id"),
        "status": merged.get("status"),
        **({"attempt_id": merged["attempt_id"]} if "attempt_id" in merged else {}),
        **{k: v for k, v in (meta.get("ids") or {}).items() if v is not None},
        "counts": meta.get("counts"),
    }
    error = meta.get("error")
    if error:
        out["error_code"] = error.get("code")
    if _payloads:
        out["content"] = json.loads(terminal.get("event", "{}")).get("content")
    return out


def _pairs(fields: list[Any]) -> dict[str, str]:
    return {str(fields[i]): fields[i + 1] for i in range(0, len(fields) - 1, 2)}
