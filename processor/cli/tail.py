"""``processor tail``: follow the merged responses and events of every shard.

Reading is ``processor.client.Subscriber`` (one XREAD over every shard
on a single node, one per shard on a Cluster); this module only decides where
to start, formats each item (one readable line, or one JSON line) and stops
cleanly when asked (SIGINT/SIGTERM set an event; the read in progress is at
most ``block_ms`` long).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.text import Text

from processor.client import EventItem, Item, MergedItem, Subscriber
from processor.redis_io.replies import as_text
from processor.wire.keys import Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

STREAMS = ("merged", "events")
_ID = re.compile(r"^\d+(-\d+)?$")
STATUS_STYLE = {"completed": "green", "error": "red", "cancelled": "yellow"}


class TailError(ValueError):
    """A bad ``--from`` value: one line for the operator."""


@dataclass
class Start:
    """Where to start: ``default`` for every stream, ``positions`` for named ones."""

    default: str = "$"
    positions: dict[str, str] = field(default_factory=dict)


def parse_from(values: list[str] | None, keys: Namespace) -> Start:
    """``--from`` values: ``beginning``, ``now``, an entry id, or ``STREAM=ID`` (repeatable)."""
    start = Start()
    streams = {getattr(shard, kind) for shard in keys.all() for kind in STREAMS}
    defaults = []
    for value in values or []:
        key, sep, position = value.rpartition("=")
        if sep:
            if key not in streams:
                known = ", ".join(sorted(streams)[:4])
                raise TailError(f"--from {value}: {key!r} is not a followed stream (e.g. {known})")
            if not _ID.match(position):
                raise TailError(f"--from {value}: {position!r} is not an entry id")
            start.positions[key] = position
        elif value in ("beginning", "0"):
            defaults.append("0-0")
        elif value in ("now", "$"):
            defaults.append("$")
        elif _ID.match(value):
            defaults.append(value)
        else:
            raise TailError(
                f"--from {value}: expected beginning, now, an entry id or STREAM=ID"
            )
    if len(defaults) > 1:
        raise TailError("--from: give at most one of beginning, now or an entry id")
    if defaults:
        start.default = defaults[0]
    return start


# --------------------------------------------------------------------------- formatting


def shard_index(stream: str) -> int:
    """The shard of a stream key ``{ns:s}:kind``."""
    tag = stream[: stream.index("}")]
    return int(tag.rpartition(":")[2])


def short(text: str, width: int) -> str:
    """``text`` on one line (whitespace runs become one space), cut to ``width``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(0, width - 1)] + "…"


def response_text(response: dict[str, Any]) -> str:
    """The text contents of a merged response, in order."""
    return "".join(
        str(content.get("text") or "")
        for message in response.get("messages") or []
        for content in message.get("contents") or []
        if content.get("type") == "text"
    )


def _turn(response_id: str, attempt_id: str | None) -> str:
    return f"{response_id}/{attempt_id}" if attempt_id else response_id


def _clock(entry_id: str) -> str:
    ms = int(entry_id.partition("-")[0])
    return datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S.%f")[:-3]


def _merged_parts(item: MergedItem, width: int) -> list[tuple[str, str]]:
    counts = item.meta.get("counts") or {}
    messages = len(item.response.get("messages") or [])
    tail = f"messages={messages} updates={counts.get('updates', '?')}"
    if counts.get("dlq"):
        tail += f" dlq={counts['dlq']}"
    if counts.get("dropped"):
        tail += f" dropped={counts['dropped']}"
    for name in ("missing", "duplicates"):  # numbered entries (docs/contract.md §3.4)
        if counts.get(name):
            tail += f" {name}={counts[name]}"
    return [
        (item.status, STATUS_STYLE.get(item.status, "")),
        (json.dumps(short(response_text(item.response), width), ensure_ascii=False), ""),
        (tail, "dim"),
    ]


def _event_parts(event: dict[str, Any], width: int) -> list[tuple[str, str]]:
    kind = event.get("type")
    parts = [(f"seq={event.get('seq')}", "dim")]
    quoted = ""
    if kind == "synthesis":
        status = str(event.get("status", ""))
        parts.append((status, STATUS_STYLE.get(status, "")))
        error = event.get("error") or {}
        if error:
            parts.append((f"{error.get('code')}: {short(str(error.get('message')), width)}", "red"))
        quoted = str(event.get("content") or "")
    elif kind in ("synthesis.chunk", "reasoning.chunk", "tool_call.chunk"):
        parts.append((f"message={event.get('message_id')}", ""))
        if event.get("replace"):
            parts.append(("replace", "dim"))
        quoted = str(event.get("delta") or "")
    elif kind == "tool_result":
        parts.append((f"message={event.get('message_id')} call={event.get('call_id')}", ""))
        result = event.get("result")
        quoted = result if isinstance(result, str) else json.dumps(result)
    elif kind == "step":
        parts.append((f"{event.get('step')} agent={event.get('agent_name') or '-'}", ""))
        quoted = str(event.get("content") or "")
    elif kind == "synthesis.started":
        ids = [f"{k}={event[k]}" for k in ("turn_id", "session_id", "run_id") if event.get(k)]
        if ids:
            parts.append((" ".join(ids), "dim"))
    if quoted:
        parts.append((json.dumps(short(quoted, width), ensure_ascii=False), ""))
    return parts


def line(item: Item, width: int = 80) -> Text:
    """One readable line: time, shard, type, turn, then status and a short content."""
    if isinstance(item, MergedItem):
        kind, turn = "merged", _turn(item.response_id, item.attempt_id)
        parts = _merged_parts(item, width)
    elif isinstance(item, EventItem):
        kind = item.type
        turn = _turn(item.response_id, item.event.get("attempt_id"))
        parts = _event_parts(item.event, width)
    else:
        kind, turn, parts = "entry", "?", [(json.dumps(item.fields)[:width], "")]
    text = Text.assemble(
        (_clock(item.id), "dim"), " ", (f"s{shard_index(item.stream)}", "dim"), " ",
        (f"{kind:<17}", "bold"), " ", (turn, "cyan"),
    )
    for part, style in parts:
        text.append(" ")
        text.append(part, style)
    return text


def as_json(item: Item) -> dict[str, Any]:
    """One JSON object per output entry: where it is, then its fields (decoded)."""
    head = {"stream": item.stream, "shard": shard_index(item.stream), "id": item.id}
    if isinstance(item, MergedItem):
        body: dict[str, Any] = {
            "type": "merged", "response_id": item.response_id,
            "synthesis_id": item.synthesis_id, "status": item.status,
            "response": item.response, "meta": item.meta,
        }
        if item.attempt_id:
            body["attempt_id"] = item.attempt_id
        return {**head, **body}
    if isinstance(item, EventItem):
        return {**head, "type": item.type, "event": item.event}
    return {**head, "type": "entry", "fields": item.fields}


# --------------------------------------------------------------------------- following


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _before(entry_id: str) -> str:
    """The greatest entry id below ``entry_id`` (a position that re-reads it)."""
    ms, seq = _id_tuple(entry_id)
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-18446744073709551615"


def _caught_up(positions: dict[str, str], ends: dict[str, str]) -> bool:
    """Every stream has been read up to its end (``$`` is not resolved yet: not caught up)."""
    return all(
        positions.get(key, "$") != "$" and _id_tuple(positions[key]) >= _id_tuple(end)
        for key, end in ends.items()
    )


@dataclass
class Tail:
    """Follows ``merged`` and ``events`` of every shard until stopped."""

    client: RedisClient
    keys: Namespace
    start: Start
    follow: bool = True
    limit: int | None = None
    block_ms: int = 500
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    seen: int = 0
    positions: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        """Stop after the read in progress (signal handlers call this)."""
        self.stopping.set()

    async def run(self, emit: Callable[[Item], None]) -> int:
        """Call ``emit`` for each item until stopped, the limit, or (no follow) caught up."""
        sub = Subscriber(
            self.client, self.keys.name, self.keys.shards, STREAMS,
            from_positions=self.start.positions, start=self.start.default,
            block_ms=self.block_ms,
        )
        ends = None if self.follow else await self._ends()
        try:
            while not self.stopping.is_set():
                if ends is not None and _caught_up(sub.positions, ends):
                    break
                items = await sub.read(self.block_ms)
                self.positions = dict(sub.positions)
                if self._deliver(items, emit):
                    break
        finally:
            await sub.aclose()
        return self.seen

    async def _ends(self) -> dict[str, str]:
        """The last entry id of every followed stream now (the end of a --no-follow tail)."""
        ends = {}
        for shard in self.keys.all():
            for kind in STREAMS:
                key = getattr(shard, kind)
                last = await self.client.xrevrange(key, count=1)
                if last:
                    ends[key] = as_text(last[0][0])
        return ends

    def _deliver(self, items: list[Item], emit: Callable[[Item], None]) -> bool:
        """Emit ``items``; True once the limit is reached (positions stop at the last emitted)."""
        for n, item in enumerate(items):
            if self.limit is not None and self.seen >= self.limit:
                for rest in reversed(items[n:]):
                    self.positions[rest.stream] = _before(rest.id)
                return True
            emit(item)
            self.seen += 1
        return self.limit is not None and self.seen >= self.limit

    def resume_args(self) -> list[str]:
        """``--from`` arguments that continue where this tail stopped."""
        return [f"--from {key}={pos}" for key, pos in sorted(self.positions.items())
                if pos != "$"]
