"""The scripts for what Redis lost: ``publish_lost_turns.lua`` (publish from
memory the turns a namespace lost with its state) and ``dead_letter_lost.lua``
(dead-letter the entries deleted while pending, mark the turns they were in)
and ``recreate_group.lua`` (put back a consumer group that vanished)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import msgspec

from processor.engine.replay import Settled
from processor.redis_io.replies import as_text
from processor.scripts.calls import BatchOptions, ScriptCall, msgpack_str
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.stream_ids import id_order

if TYPE_CHECKING:
    from processor.redis_io.client import Script

_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


#: A turn published from memory after the namespace's state was lost: its
#: key, the ids of its entries this worker held, its outputs (``reason="lost"``).
LostOutcome = tuple[TurnKey, list[str], Settled]


def build_publish_lost(
    shard: Shard, turns: list[LostOutcome], options: BatchOptions,
) -> ScriptCall:
    """KEYS/ARGV of ``publish_lost_turns``, one ``LostOutcome`` per turn."""
    keys = [shard.merged, shard.events, shard.dlq, shard.active, shard.closing, shard.updates]
    rows = []
    for key, ids, outcome in turns:
        tk = key.encode()
        keys += [shard.turn(tk), shard.recs(tk), shard.done(tk), shard.live(tk)]
        rows.append((tk, outcome.status, msgpack_str(outcome.outputs),
                     msgpack_str(outcome.dead_letters), ids))
    if options.agui:
        keys.append(shard.agui)
    return ScriptCall(keys, [options.merged_maxlen, options.events_maxlen, options.dlq_maxlen,
                             options.done_ttl, len(turns), options.group, _pack.encode(rows)])


#: The DLQ reason, and its ``detail``, of an entry deleted while pending.
ENTRY_LOST = "entry_lost"


ENTRY_LOST_DETAIL = ("the entry was deleted from the stream while it was pending (a trim or "
                     "an XDEL): its data is gone")


def build_dead_letter_lost(
    shard: Shard, pending: list[str], removed: list[str], turns: list[TurnKey], first: str,
    options: BatchOptions,
) -> ScriptCall:
    """KEYS/ARGV of ``dead_letter_lost``: ids still pending to this consumer
    (acked there), ids already out of the pending list, the turns to mark
    with ``first``, the oldest lost id."""
    keys = [shard.updates, shard.dlq]
    for key in turns:
        tk = key.encode()
        keys += [shard.turn(tk), shard.done(tk)]
    return ScriptCall(keys, [options.group, options.dlq_maxlen, ENTRY_LOST, ENTRY_LOST_DETAIL,
                             len(pending), len(turns), first, *pending, *removed])


def lost_turns_of(
    lost: list[str], active: dict[TurnKey, tuple[int, str]],
) -> list[TurnKey]:
    """The turns that may have had one of the ``lost`` entries: those open
    when it was written. ``active``: each active turn of the shard with the
    time it started (ms; Redis's clock when its first entry was applied or
    it was opened, so its first entry was written no later) and the padded
    id of the entry that ended it ("" when none yet). A turn is marked when
    it started at or before a lost entry's time and had not ended before
    that entry. Turns started later are not, although the lost entry may
    have been their first one (written before, applied late): nothing tells
    them apart from turns that began after it; a turn all of whose entries
    were lost never started and cannot be known (docs/reliability.md)."""
    times = [id_order(entry_id) for entry_id in lost]
    marked = []
    for key, (started, ended) in active.items():
        end = id_order(ended) if ended else None  # (padded: int() reads the zeros)
        if any(started <= ms and (end is None or end > (ms, seq)) for ms, seq in times):
            marked.append(key)
    return marked


async def publish_lost_turns(script: Script, call: ScriptCall) -> list[bool]:
    """Run ``publish_lost_turns``: per turn, whether it published it (else done already)."""
    return [int(r) == 1 for r in await script(keys=call.keys, args=call.args)]


class LostLettered(NamedTuple):
    """What ``dead_letter_lost`` did."""

    ids: list[str]  # the entries dead-lettered
    marked: int  # turns marked


async def dead_letter_lost(script: Script, call: ScriptCall) -> LostLettered:
    letters, marked = await script(keys=call.keys, args=call.args)
    return LostLettered([as_text(i) for i in letters], int(marked))


class Regrouped(NamedTuple):
    """What ``recreate_group`` did."""

    status: str  # "created" | "raised" | "kept"
    delivered: str  # the group's last delivered id
    claimed: int  # this consumer's entries restored to its pending list


def build_recreate_group(shard: Shard, group: str, last: str, consumer: str,
                         pending: list[str]) -> ScriptCall:
    """KEYS/ARGV of ``recreate_group``: the newest entry the consumer read
    there (``"0"``: none) and the entries it has pending, as far as it knows."""
    return ScriptCall([shard.updates], [group, last, consumer, *pending])


async def recreate_group(script: Script, call: ScriptCall) -> Regrouped:
    status, delivered, claimed = await script(keys=call.keys, args=call.args)
    return Regrouped(as_text(status), as_text(delivered), int(claimed))
