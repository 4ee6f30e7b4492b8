"""``publish_live.lua``: a batch's live progress (events, live log entries)
for many turns in one call."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import msgspec

from processor.scripts.calls import (
    BatchOptions,
    ScriptCall,
    call_ids,
    cut_events,
    msgpack_str,
)
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.outputs import Event

_pack = msgspec.msgpack.Encoder()

if TYPE_CHECKING:
    from processor.redis_io.client import Script


class LiveTurn(NamedTuple):
    """One turn in a ``publish_live`` call (``publish_live.lua``)."""

    key: TurnKey
    events: list[Event]  # its live events (seq 0)
    updates: bytes  # the updates since its last log entry, one JSON array text
    spoken: int  # how many of the caller's calls for the turn ran before (0: the first)
    renew: bool  # give its live log its TTL again


def build_publish_live(
    shard: Shard, turns: list[LiveTurn], options: BatchOptions, speaker: str
) -> ScriptCall:
    """``publish_live``'s KEYS/ARGV for the turns' events and updates, said by
    ``speaker`` (the worker's token in the turns' ``live`` field)."""
    packed: list[str | int | msgspec.Raw] = []  # (flat: one Lua table, not one per turn)
    for key, found, updates, spoken, renew in turns:
        tk, response_id, synthesis_id, attempt_id = call_ids(key)
        before = f"{speaker} {spoken}" if spoken else ""
        packed += [tk, before, f"{speaker} {spoken + 1}", int(renew), msgpack_str(updates),
                   response_id, synthesis_id, attempt_id, len(found)]
        packed += cut_events(found)
    return ScriptCall(keys=[shard.events], args=[options.events_maxlen, options.live_ttl,
                                                 len(turns), shard.tag, _pack.encode(packed)])


def updates_json(texts: list[bytes]) -> bytes:
    """Update JSON texts as one JSON array text."""
    return b"[" + b",".join(texts) + b"]"


async def publish_live(script: Script, call: ScriptCall) -> list[int]:
    """Run ``publish_live``: per turn, the events it published, or a refusal
    (negative: ``publish_live.lua``'s Returns)."""
    return [int(r) for r in await script(keys=call.keys, args=call.args)]
