"""``processor dlq``: read the dead-letter streams and replay fixed entries.

A DLQ entry (docs/contract.md §5.3) is the input entry's original fields followed by
what the worker appended: ``reason``, ``detail``, ``source_id``,
``deliveries`` and, for an entry of more fields than one script call can
add back, ``packed=1`` (its fields kept whole, msgpack-packed in
``packed_fields``); ``truncated=1`` marks a copy cut by a worker of a
version that capped dead letters in bytes. Those appended fields come last;
the replay strips exactly that tail, in Lua.

Replaying adds the original fields (or fixed ones) back to the same shard's
``updates`` stream and deletes the DLQ entry in one Lua step
(``replay_dead_letter.lua``). Before that, the fields are decoded as the
worker would: an entry that would go straight back to the DLQ is refused
with the reason, and so is one whose turn already ended (it would come back
as ``turn_closed``), unless forced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from processor.ingest.decode import EntryError, decode_entry, routing_id, turn_key
from processor.redis_io.replies import as_text
from processor.scripts import source
from processor.wire.ids import shard_of
from processor.wire.keys import Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

#: What a worker appends to the original fields, in this order.
ADDED = ("reason", "detail", "source_id", "deliveries")
#: At most this many fields in a replayed entry (a Lua unpack limit; the DLQ keeps 1000).
MAX_FIELDS = 1000

Pairs = list[tuple[str, bytes]]
_ENTRY_ID = re.compile(r"^\d+-\d+$")


class DlqError(Exception):
    """A dead letter that cannot be found, read or replayed: one line for the operator."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One DLQ entry, split into the original fields and what the worker added."""

    shard: int
    id: str
    original: Pairs
    added: dict[str, str]

    @property
    def reason(self) -> str:
        return self.added.get("reason", "")

    @property
    def truncated(self) -> bool:
        return self.added.get("truncated") == "1"

    @property
    def packed(self) -> bool:
        """Its fields kept whole as one msgpack array (``packed_fields``):
        more than one script call can add back."""
        return self.added.get("packed") == "1"

    def get(self, name: str) -> str:
        """An original field as text ('' when absent; invalid UTF-8 replaced)."""
        for key, value in self.original:
            if key == name:
                return value.decode("utf-8", "replace")
        return ""

    def turn(self) -> str:
        """``response_id`` (``/attempt``), or ``turn_id=...``; ``?`` when it has neither."""
        rid, attempt, tid = self.get("response_id"), self.get("attempt_id"), self.get("turn_id")
        label = rid or (f"turn_id={tid}" if tid else "?")
        return f"{label}/{attempt}" if attempt else label

    def payload(self) -> str:
        """The ``update`` field, else the other original fields as ``name=value`` text."""
        update = self.get("update")
        if update:
            return update
        skip = {"response_id", "attempt_id", "turn_id"}
        return " ".join(f"{k}={v.decode('utf-8', 'replace')}" for k, v in self.original
                        if k not in skip)

    def original_fields(self) -> dict[str, str]:
        """The original fields as a JSON-able object (what ``--from-file`` takes)."""
        return {k: v.decode("utf-8", "replace") for k, v in self.original}

    def to_json(self, prefix: int | None = None) -> dict[str, Any]:
        """The entry for ``--json``: ids, added fields and original fields (cut to ``prefix``)."""
        fields = self.original_fields()
        if prefix is not None:
            fields = {k: clip(v, prefix) for k, v in fields.items()}
        return {"shard": self.shard, "id": self.id, **self.added, "turn": self.turn(),
                "fields": fields}


def clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(0, width - 1)] + "…"


def _name(key: Any) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


def split(shard: int, entry_id: str, raw: Mapping[Any, Any]) -> DeadLetter:
    """A DLQ entry from its fields as redis-py returns them (a mapping).

    The replay itself reads the raw fields in Lua, so it stays exact even
    when an original field shares a name with an added one (the mapping keeps
    only the added value of such a name).
    """
    pairs: Pairs = [(_name(k), v if isinstance(v, bytes) else str(v).encode())
                    for k, v in raw.items()]
    added = {k: v.decode("utf-8", "replace") for k, v in pairs
             if k in (*ADDED, "truncated", "packed")}
    if any(name not in added for name in ADDED):
        raise DlqError(f"entry {entry_id} of shard {shard} is not a dead letter of processor")
    original = [(k, v) for k, v in pairs if k not in added]
    return DeadLetter(shard, entry_id, original, added)


async def _xrange(client: RedisClient, key: str, start: str, count: int) -> list[tuple[str, Any]]:
    reply: Any = await client.xrange(key, start, "+", count=count)
    return [(as_text(entry_id), fields) for entry_id, fields in reply]


async def listing(
    client: RedisClient, keys: Namespace, shards: list[int], limit: int, reason: str | None = None,
    advance: Callable[[], None] | None = None,
) -> list[DeadLetter]:
    """Up to ``limit`` dead letters per shard (oldest first), of ``reason`` when given."""
    out: list[DeadLetter] = []
    for index in shards:
        start = "-"
        found: list[DeadLetter] = []
        while len(found) < limit:
            page = await _xrange(client, keys.shard(index).dlq, start, 500)
            if not page:
                break
            for entry_id, fields in page:
                try:
                    letter = split(index, entry_id, fields)
                except DlqError:
                    continue  # not written by a worker: only what can be replayed is listed
                if reason is None or letter.reason == reason:
                    found.append(letter)
            start = "(" + page[-1][0]
            if len(page) < 500:
                break
        out += found[:limit]
        if advance is not None:
            advance()
    return out


async def find(client: RedisClient, keys: Namespace, entry_id: str,
               shard: int | None) -> DeadLetter:
    """The dead letter ``entry_id`` (of ``shard``, else of whichever shard has it)."""
    if not _ENTRY_ID.match(entry_id):
        raise DlqError(f"{entry_id!r} is not an entry id (like 1700000000000-0)")
    candidates = [shard] if shard is not None else list(range(keys.shards))
    found = []
    for index in candidates:
        reply: Any = await client.xrange(keys.shard(index).dlq, entry_id, entry_id, count=1)
        found += [split(index, as_text(got_id), fields) for got_id, fields in reply]
    if not found:
        where = f"shard {shard}" if shard is not None else f"any of {keys.shards} shard(s)"
        raise DlqError(f"no dead letter {entry_id} in {where} of namespace {keys.name}")
    if len(found) > 1:
        shards = ", ".join(str(d.shard) for d in found)
        raise DlqError(f"dead letter {entry_id} is in shards {shards}: give --shard")
    return found[0]


# --------------------------------------------------------------------------- replay


def fields_from_json(text: str) -> list[tuple[str, str]]:
    """Fixed fields from a JSON object (``update`` may be an object: it is encoded)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DlqError(f"the fields are not JSON: {exc}") from None
    if not isinstance(obj, dict) or not obj:
        raise DlqError("the fields must be a non-empty JSON object of field names to values")
    if len(obj) > MAX_FIELDS:
        raise DlqError(f"{len(obj)} fields: at most {MAX_FIELDS} can be replayed")
    out = []
    for name, value in obj.items():
        if name == "update" and isinstance(value, dict | list):
            value = json.dumps(value, ensure_ascii=False)
        if not isinstance(value, str):
            raise DlqError(f"field {name!r} must be a string (or, for 'update', an object)")
        out.append((name, value))
    return out


async def check(
    client: RedisClient, keys: Namespace, letter: DeadLetter, fields: list[tuple[str, Any]]
) -> None:
    """Refuse fields the worker would dead-letter again (bad entry, wrong shard, ended turn)."""
    as_map = dict(fields)
    try:
        decode_entry(as_map)
    except EntryError as exc:
        reason = f"{exc.reason}: {exc.detail}"
        raise DlqError(f"the entry would be dead-lettered again: {reason}") from None
    home = shard_of(routing_id(as_map), keys.shards)
    if home != letter.shard:
        raise DlqError(
            f"the entry belongs to shard {home} of {keys.shards}, not to the DLQ's shard "
            f"{letter.shard} (a producer with another shard count wrote it)"
        )
    done = keys.shard(letter.shard).done(turn_key(as_map).encode())
    if await client.exists(done):
        raise DlqError(
            f"turn {letter.turn()} already ended: the entry would come back as turn_closed"
        )


async def replay(
    client: RedisClient, keys: Namespace, letter: DeadLetter,
    fields: list[tuple[str, str]] | None = None, *, force: bool = False,
) -> str:
    """Move ``letter`` back to its shard's updates stream (with ``fields`` if given).

    Returns the new entry id. Raises ``DlqError`` when it is refused.
    """
    if fields is None and letter.truncated:
        raise DlqError(
            f"dead letter {letter.id} was truncated when stored: replay it with --from-file"
        )
    if fields is None and letter.packed:
        raise DlqError(
            f"dead letter {letter.id} has more fields than one replay can add (they are kept "
            "whole, msgpack-packed in packed_fields): replay it with --from-file"
        )
    if not force:
        await check(client, keys, letter, fields if fields is not None else letter.original)
    shard = keys.shard(letter.shard)
    args: list[Any] = [letter.id]
    for name, value in fields or []:
        args += [name, value]
    script = client.register_script(source("replay_dead_letter"))
    try:
        new_id = await script(keys=[shard.dlq, shard.updates], args=args)
    except ResponseError as exc:
        raise DlqError(str(exc)) from None
    return as_text(new_id)
