"""Server-sent events (the WHATWG HTML "event stream" format): framing for
the server, and a parser that reads a stream the way a browser's
``EventSource`` does (for the tests, the load benchmark and Python clients).

Pure: bytes in, bytes or parsed events out.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_BYTES_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def frame(data: bytes | str, *, id: str | None = None, event: str | None = None) -> bytes:
    """One event: optional ``id:`` and ``event:`` lines, one ``data:`` line per
    line of ``data`` (a reader joins them with ``\\n``), and the blank line
    that dispatches it. Text is sent as UTF-8 (a lone surrogate, which UTF-8
    cannot hold, as U+FFFD)."""
    head = b""
    if id is not None:
        head += b"id: " + _field_value("id", id) + b"\n"
    if event is not None:
        head += b"event: " + _field_value("event", event) + b"\n"
    body = data if isinstance(data, bytes) else _utf8(data)
    if b"\n" not in body and b"\r" not in body:  # JSON: always one line
        return head + b"data: " + body + b"\n\n"
    lines = _BYTES_LINE_BREAK.split(body)
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def comment(text: str) -> bytes:
    """A comment (``: text``): readers ignore it; proxies see the stream alive.
    No blank line after it: that would dispatch an event with no data, which
    ``EventSource`` drops but ``@microsoft/fetch-event-source`` hands to
    ``onmessage`` (``data: ""``, which a ``JSON.parse`` throws on)."""
    lines = _LINE_BREAK.split(text)
    return _utf8("".join(f": {line}\n" for line in lines))


def retry(milliseconds: int) -> bytes:
    """How long a reader waits before it reconnects after the stream breaks
    (a field line of its own: it takes effect as it is read, and, as with
    ``comment``, no blank line dispatches an empty event)."""
    return f"retry: {int(milliseconds)}\n".encode("ascii")


def _field_value(name: str, value: str) -> bytes:
    if _LINE_BREAK.search(value) or "\0" in value:
        raise ValueError(f"an SSE {name} cannot hold a line break or NUL: {value!r}")
    return _utf8(value)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text).encode()


@dataclass(frozen=True)
class Event:
    """A dispatched event. ``id`` is the event's own ``id:`` field (None when
    it had none); ``last_event_id`` is what ``EventSource`` would report."""

    data: str
    event: str = "message"
    id: str | None = None
    last_event_id: str = ""


@dataclass(frozen=True)
class Comment:
    text: str


class Parser:
    """Feed it the stream's bytes in chunks of any size; it returns what each
    chunk completed, in order (HTML's "interpreting an event stream")."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""  # an incomplete line
        self._after_cr = False  # the last chunk ended in CR: a leading LF is part of it
        self._first = True  # a leading byte order mark is dropped
        self.last_event_id = ""
        self.retry_ms: int | None = None
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[Event | Comment]:
        text = self._decoder.decode(chunk)
        if self._first and text:
            text = text.removeprefix("\ufeff")
            self._first = False
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        if text:
            self._after_cr = text.endswith("\r")
        out: list[Event | Comment] = []
        lines = _LINE_BREAK.split(self._pending + text)
        self._pending = lines.pop()  # the part after the last line break
        for line in lines:
            self._line(line, out)
        return out

    def _line(self, line: str, out: list[Event | Comment]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line.startswith(":"):
            out.append(Comment(line[1:].removeprefix(" ")))
            return
        name, colon, value = line.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
                self.last_event_id = value
        elif name == "retry" and value.isdigit() and value.isascii():
            self.retry_ms = int(value)

    def _dispatch(self, out: list[Event | Comment]) -> None:
        data, event, own_id = self._data, self._event, self._id
        self._data, self._event, self._id = [], "", None
        if data:
            out.append(Event("\n".join(data), event or "message", own_id, self.last_event_id))
