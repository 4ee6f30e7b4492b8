"""Stream ids that break a shard: exhausted, or far ahead of Redis's clock.

``XADD`` with an explicit id (which any user allowed ``XADD`` may send)
moves a stream's last id wherever it says. At
``18446744073709551615-18446744073709551615`` every later ``XADD *`` fails
("The stream has exhausted the last possible ID") until the stream is
repaired; an id far ahead of Redis's clock makes every later ``XADD *``
count up from it, so it gets there one entry at a time (and entry ids stop
telling times). A worker sees either in its group's ``last-delivered-id``
(``XINFO GROUPS``, no payload read) once it has read the entry; ``processor
repair-stream`` (``processor.scripts.repair``) brings the stream back.

Pure functions; ids are compared as integers (Lua and floats cannot hold
them).
"""

from __future__ import annotations

import re

#: The last possible stream id.
MAX_ID = (2**64 - 1, 2**64 - 1)
#: How far ahead of Redis's clock an id may be before it counts as bad: far
#: more than any clock step, far less than what an attacker's id would use.
MAX_AHEAD_MS = 3_600_000

_ID = re.compile(r"^(\d+)-(\d+)$")


def id_order(entry_id: str) -> tuple[int, int]:
    """Stream ids sort by (ms, seq) as numbers."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def after(entry_id: str) -> str:
    """The smallest id after ``entry_id`` ("ms-seq")."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def parse(entry_id: str) -> tuple[int, int]:
    """``"ms-seq"`` as two integers (``ValueError`` for anything else)."""
    match = _ID.match(entry_id)
    if match is None:
        raise ValueError(f"not a stream id: {entry_id!r}")
    return int(match.group(1)), int(match.group(2))


def problem(entry_id: str, now_ms: int, max_ahead_ms: int = MAX_AHEAD_MS) -> str | None:
    """Why a stream whose ids reached ``entry_id`` is broken at Redis time
    ``now_ms``, or None when it is not."""
    ms, seq = parse(entry_id)
    if (ms, seq) == MAX_ID:
        return f"ids exhausted (last id {entry_id}): every XADD fails"
    if ms > now_ms + max_ahead_ms:
        ahead = (ms - now_ms) / 3_600_000
        return f"ids {ahead:.0f} h ahead of Redis's clock (last id {entry_id})"
    return None


def redis_ms(time_reply: tuple[int, int] | list[int]) -> int:
    """Milliseconds from redis-py's ``TIME`` reply (seconds, microseconds)."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000
