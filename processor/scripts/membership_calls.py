"""The scripts of a worker's place in its group: ``beat_worker.lua`` (say it
is alive, or leave) and ``admit_inbox.lua`` (move a shard's inbox, which
the least-privilege producers write, into its stream)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

from processor.redis_io.replies import as_text
from processor.scripts.calls import ScriptCall
from processor.wire.keys import Shard

if TYPE_CHECKING:
    from processor.redis_io.client import Script


def build_beat(workers: str, consumer: str, ttl_ms: int,
               what: Literal["beat", "leave"]) -> ScriptCall:
    """KEYS/ARGV of ``beat_worker`` on the group's ``workers`` zset."""
    return ScriptCall([workers], [consumer, ttl_ms, what])


async def beat_worker(script: Script, call: ScriptCall) -> list[str]:
    """Run ``beat_worker``: the live consumer names, in name order."""
    return [as_text(name) for name in await script(keys=call.keys, args=call.args)]


class Admitted(NamedTuple):
    """What one ``admit_inbox`` call did."""

    admitted: int  # items moved into the stream
    dead: int  # malformed items dead-lettered
    left: int  # items left in the inbox
    error: str  # '' or the error of the XADD that stopped the call


def build_admit(shard: Shard, items: int, size: int, reason: str,
                dlq_maxlen: int) -> ScriptCall:
    """KEYS/ARGV of ``admit_inbox``: at most ``items`` items and ``size``
    bytes (at least one item); ``reason`` for a malformed one."""
    return ScriptCall([shard.inbox, shard.inbox_bell, shard.updates, shard.dlq],
                      [items, size, reason, dlq_maxlen])


async def admit_inbox(script: Script, call: ScriptCall) -> Admitted:
    admitted, dead, left, error = await script(keys=call.keys, args=call.args)
    return Admitted(int(admitted), int(dead), int(left), as_text(error) if error else "")
