"""``processor capture``: the input entries as they arrive, written in the
JSONL format ``processor merge`` reads, to replay a turn offline.

It follows every shard's ``updates`` stream (or the shard of one turn) by
reading after a position (``read_inputs.lua``): never with a consumer group,
so it takes nothing from the workers and changes nothing. Workers delete
the entries they applied, so a capture must run while the entries arrive:
it waits for new entries with XREAD BLOCK (Redis wakes it in the same step
as the XADD) and reads them within a round trip, before a worker has
applied and deleted them. Each read also tells whether an entry after the
position was deleted before it was read (Redis 7's
``max-deleted-entry-id``): such a capture is reported incomplete (one line
on stderr, exit status 1).

Each line is one entry: ``{"id": <entry id>, <field>: <value>, ...}`` with
every field as text, ``update`` as JSON text (an update sent as msgpack is
written as JSON, without its ``enc`` field). A cancellation is a key, not an
entry: following one turn (``--turn``), a ``{"response_id": ..., "kind":
"cancel"}`` line is written when its key appears, and the capture stops there
or after the turn's ``end`` or ``error`` entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from redis.asyncio.cluster import RedisCluster

from processor.redis_io.client import streams_arg
from processor.redis_io.replies import as_text
from processor.scripts import source
from processor.wire.cancels import REASON_BYTES, reason_of
from processor.wire.keys import Namespace, Shard

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

_ID = re.compile(r"^\d+(-\d+)?$")
_msgpack = msgspec.msgpack.Decoder()
#: Entries read per shard per call.
COUNT = 500


class CaptureError(ValueError):
    """A bad argument: one line for the user."""


def start_position(value: str | None) -> str:
    """``--from``: ``now`` (default, the entries added from now on),
    ``beginning`` (every entry still in the streams) or an entry id."""
    if value in (None, "now", "$"):
        return "$"
    if value in ("beginning", "0"):
        return "0-0"
    if _ID.match(value):
        return value if "-" in value else f"{value}-0"
    raise CaptureError(f"--from {value}: expected now, beginning or an entry id")


def _id_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def capture_fields(entry_id: str, flat: list[Any]) -> tuple[dict[str, str], list[str]]:
    """An entry's line as a dict (its id, then its flat ``[name, value, ...]``
    fields as text), and what could not be written exactly."""
    raw = {_text(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}
    problems: list[str] = []
    if raw.get("enc") in (b"msgpack", "msgpack") and isinstance(raw.get("update"), bytes):
        try:
            raw["update"] = msgspec.json.encode(_msgpack.decode(raw["update"]))
            del raw["enc"]
        except (msgspec.DecodeError, TypeError, ValueError) as exc:
            problems.append(f"field 'update' is not msgpack that JSON can hold ({exc})")
    fields = {"id": entry_id}
    for name, value in raw.items():
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                problems.append(f"field {name!r} is not UTF-8 text (written with U+FFFD)")
                value = value.decode("utf-8", "replace")
        fields[name] = str(value)
    return fields, problems


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def cancel_line(response_id: str, reason: str | None = None) -> bytes:
    """The line ``processor merge`` reads as "the turn was cancelled here"
    (with the cancel's reason, when its key had one)."""
    line = {"response_id": response_id, "kind": "cancel"}
    if reason is not None:
        line["reason"] = reason
    return msgspec.json.encode(line)


@dataclass
class Capture:
    """Follows the input of ``keys`` (every shard, or ``turn``'s) from ``start``."""

    client: RedisClient
    keys: Namespace
    start: str = "$"
    turn: str | None = None
    follow: bool = True
    limit: int | None = None
    poll: float = 0.05  # seconds between reads on a Cluster
    block_ms: int = 200  # the longest wait for an entry elsewhere (a stop waits for it)
    written: int = 0
    missed: list[str] = field(default_factory=list)  # streams with entries deleted unread
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._read = self.client.register_script(source("read_inputs"))
        self.shards = [self.keys.shard_for(self.turn)] if self.turn else self.keys.all()
        self.positions = {shard.index: self.start for shard in self.shards}

    async def begin(self) -> None:
        """Fix where each shard starts (``now``: after its last entry), so
        entries added once this returns are captured."""
        for shard in self.shards:
            if self.positions[shard.index] == "$":
                after, _, _, _ = await self._read(keys=[shard.updates], args=["$", 0])
                self.positions[shard.index] = as_text(after)

    def stop(self) -> None:
        """Stop after the read in progress (signal handlers call this)."""
        self.stopping.set()

    async def run(self, write: Callable[[bytes], None], warn: Callable[[str], None]) -> int:
        """Write each entry's line until stopped, the limit, the followed turn's
        end (or cancel) or, without ``follow``, the end of what is there."""
        await self.begin()
        first = {shard.index for shard in self.shards}
        while not self.stopping.is_set():
            batch: list[tuple[str, list[Any]]] = []
            cancelled = False
            for shard in self.shards:
                entries, shard_cancelled = await self._read_shard(shard, shard.index in first,
                                                                  warn)
                first.discard(shard.index)
                batch += entries
                cancelled = cancelled or shard_cancelled
            batch.sort(key=lambda entry: _id_order(entry[0]))
            if self._write(batch, write, warn):
                break
            if cancelled and self.turn:
                # Its reason as a worker reads it: the first 1 KiB, as text.
                raw = await self.client.getrange(self.shards[0].cancel(self.turn), 0,
                                                 REASON_BYTES - 1)
                write(cancel_line(self.turn, reason_of(raw)))
                break
            if not batch and not self.follow:
                break
            if not batch:
                await self._wait()
        return self.written

    async def _wait(self) -> None:
        """Until an entry is added after the positions (XREAD BLOCK: Redis
        answers it in the same step as the XADD) or a short while has
        passed. On a Cluster with several shards (one XREAD cannot span
        their slots) it polls."""
        if isinstance(self.client, RedisCluster) and len(self.shards) > 1:
            with contextlib.suppress(TimeoutError):  # the poll interval, cut short by a stop
                await asyncio.wait_for(self.stopping.wait(), self.poll)
            return
        streams = {shard.updates: self.positions[shard.index] for shard in self.shards}
        await self.client.xread(streams_arg(streams), count=1, block=self.block_ms)

    async def _read_shard(
        self, shard: Shard, first: bool, warn: Callable[[str], None]
    ) -> tuple[list[tuple[str, list[Any]]], bool]:
        keys = [shard.updates]
        if self.turn:
            keys.append(shard.cancel(self.turn))
        after, entries, max_deleted, cancelled = await self._read(
            keys=keys, args=[self.positions[shard.index], COUNT])
        after, max_deleted = as_text(after), as_text(max_deleted)
        # From "beginning", what was trimmed before the capture started is history.
        history = first and self.start == "0-0"
        if (max_deleted and not history and _id_order(max_deleted) > _id_order(after)
                and shard.updates not in self.missed):
            self.missed.append(shard.updates)
            warn(f"entries of {shard.updates} after {after} were deleted before they could be "
                 "read (workers delete what they applied): this capture misses some")
        read = [(as_text(entry_id), list(flat)) for entry_id, flat in entries]
        self.positions[shard.index] = read[-1][0] if read else after
        return read, bool(cancelled)

    def _write(self, batch: list[tuple[str, list[Any]]], write: Callable[[bytes], None],
               warn: Callable[[str], None]) -> bool:
        """Write the entries (of the followed turn); True when the capture is done."""
        for entry_id, flat in batch:
            fields, problems = capture_fields(entry_id, flat)
            if self.turn and fields.get("response_id") != self.turn:
                continue
            for problem in problems:
                warn(f"entry {entry_id}: {problem}")
            write(msgspec.json.encode(fields))
            self.written += 1
            if self.limit is not None and self.written >= self.limit:
                return True
            if self.turn and fields.get("kind") in ("end", "error"):
                return True
        return False
