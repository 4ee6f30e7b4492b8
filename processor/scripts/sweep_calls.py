"""The sweep's scripts: ``sweep_shard.lua`` (what a worker checks on a shard
when no entry forces it to) and ``cancelled_turns.lua`` (which of some
turns' cancels may be finalised now): KEYS/ARGV and named replies."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from processor.redis_io.replies import as_text
from processor.scripts.calls import ScriptCall
from processor.scripts.stored_calls import parse_member
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard

if TYPE_CHECKING:
    from processor.redis_io.client import Script


class SweepSlice(NamedTuple):
    """Where a sweep looks (``sweep_shard``'s ARGV)."""

    group: str
    timeout_ms: int
    ready_limit: int  # most ready and timed-out turns returned (0: cancels only)
    start: int  # the slice of active turns checked for cancels: from here
    size: int  # ... so many
    consumer: str
    floor: str  # includes/watermark.lua ('' = none)


class Swept(NamedTuple):
    """What ``sweep_shard`` found."""

    now_ms: int
    ready: list[TurnKey]  # turns whose closing entry is below the watermark
    expired: list[TurnKey]  # turns idle past the timeout
    cancelled: list[TurnKey]  # turns of the slice cancelled, to finalise now
    sliced: int  # active turns the slice held
    active: int  # active turns in all


def build_sweep(shard: Shard, where: SweepSlice) -> ScriptCall:
    """KEYS/ARGV of ``sweep_shard``."""
    return ScriptCall([shard.updates, shard.active, shard.closing], [*where, shard.tag])


async def sweep_shard(script: Script, call: ScriptCall) -> Swept:
    now, ready, expired, cancelled, sliced, count = await script(keys=call.keys, args=call.args)
    return Swept(int(now), [parse_member(m) for m in ready],
                 [TurnKey.decode(as_text(tk)) for tk in expired],
                 [TurnKey.decode(as_text(tk)) for tk in cancelled], int(sliced), int(count))


class CancelsDue(NamedTuple):
    """What ``cancelled_turns`` answered for the turns it was given."""

    ready: list[TurnKey]  # cancelled, to finalise now
    waiting: list[TurnKey]  # cancelled, but another worker holds them or an entry is pending


def build_cancelled(shard: Shard, turns: list[TurnKey], group: str, consumer: str,
                    floor: str) -> ScriptCall:
    """KEYS/ARGV of ``cancelled_turns`` for ``turns``."""
    keys = [shard.updates]
    for key in turns:
        keys += [shard.cancel(key.response_id), shard.turn(key.encode())]
    return ScriptCall(keys, [group, consumer, floor])


async def cancelled_turns(script: Script, call: ScriptCall,
                          turns: list[TurnKey]) -> CancelsDue:
    """``turns`` (as ``build_cancelled`` was given them), told apart."""
    ready, waiting = await script(keys=call.keys, args=call.args)
    return CancelsDue([turns[int(i) - 1] for i in ready], [turns[int(i) - 1] for i in waiting])


