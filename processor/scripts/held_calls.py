"""The held path's scripts: ``open_turns.lua`` (start the turns a held
batch begins), ``checkpoint_held.lua`` (store a long held turn's merge as one
snapshot) and ``finalise_held.lua`` (publish a held turn and ack its entries)."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from processor.engine import events as ev
from processor.engine.events import event_fields
from processor.engine.replay import Settled
from processor.redis_io.replies import as_text
from processor.scripts.calls import (
    BatchOptions,
    ScriptCall,
    call_ids,
    cut_events,
    id_list,
    msgpack_str,
)
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.wire.outputs import Event

_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()

if TYPE_CHECKING:
    from processor.redis_io.client import Script


def build_open(
    shard: Shard, turns: dict[TurnKey, dict[str, str]], options: BatchOptions, now_ms: int,
    consumer: str,
) -> ScriptCall:
    """KEYS/ARGV of ``open_turns`` for the turns a held batch starts (with
    their first entry's correlation ids), held by ``consumer``."""
    keys = [shard.events, shard.active]
    rows = []
    for key, ids in turns.items():
        tk = key.encode()
        keys += [shard.turn(tk), shard.done(tk), shard.cancel(key.response_id)]
        rows.append((tk, event_fields(key, ev.started(key, ids, now_ms))))
    return ScriptCall(keys, [options.events_maxlen, len(turns), _pack.encode(rows), consumer])


def parse_opened(turns: list[TurnKey], flat: list[Any]) -> dict[TurnKey, bool]:
    """``open_turns``' first reply for ``turns`` (as sent, in order): flat
    ``[tk, "held" | "old", ...]``, one pair per turn."""
    return {key: as_text(status) == "held"
            for key, status in zip(turns, flat[1::2], strict=True)}


#: A held turn to publish: its key, its held entry ids, the entries found
#: after its end as (id, reason, detail) (``replay.take_late``), its outputs,
#: and for a cancel the newest entry id the worker has routed ("" unknown).
class HeldOutcome(NamedTuple):
    """A held turn in a ``finalise_held`` call."""

    key: TurnKey
    ids: list[str]  # the entries held of it (since its last checkpoint)
    late: list[tuple[str, str, str]]  # entries after its end: (id, reason, detail)
    outcome: Settled
    routed: str  # for a cancel, the newest entry id routed ('' = not a cancel)
    found: list[Event]  # its last live events
    spoken: int  # publish_live calls for it that ran
    version: int  # its version: 0, or its last checkpoint's


class HeldCheckpoint(NamedTuple):
    """A held turn in a ``checkpoint_held`` call."""

    key: TurnKey
    version: int  # its version now (0, or its last checkpoint's)
    after: int  # its version once checkpointed
    updates: int  # `n`, as apply_entries would have counted its updates
    size: int  # `bytes`: its entries' bytes, as apply_entries would have counted them
    snapshot: bytes  # records.Snapshot, msgpack
    cover: str  # the newest entry in the snapshot
    ids: list[str]  # the entries held of it, acked by the call
    names: dict[str, str]  # its correlation ids


def build_checkpoint_held(shard: Shard, turns: list[HeldCheckpoint], options: BatchOptions,
                          consumer: str) -> ScriptCall:
    """KEYS/ARGV of ``checkpoint_held``."""
    keys = [shard.updates, shard.active]
    rows = []
    for turn in turns:
        tk = turn.key.encode()
        keys += [shard.turn(tk), shard.recs(tk), shard.done(tk), shard.cancel(turn.key.response_id)]
        rows.append((tk, str(turn.version), turn.after, turn.updates, turn.size,
                     msgpack_str(turn.snapshot), turn.cover, turn.ids, id_list(turn.names)))
    return ScriptCall(keys, [options.group, consumer, len(turns), _pack.encode(rows)])


def build_finalise_held(
    shard: Shard, settled: list[HeldOutcome], options: BatchOptions, consumer: str,
    speaker: str = "",
) -> ScriptCall:
    """KEYS/ARGV of ``finalise_held``, one ``HeldOutcome`` per turn (its
    last live events said by ``speaker``, the worker's ``publish_live`` token)."""
    keys = [shard.merged, shard.events, shard.dlq, shard.active, shard.updates]
    rows = []
    for key, ids, late, outcome, routed, found, spoken, version in settled:
        tk, response_id, synthesis_id, attempt_id = call_ids(key)
        keys += [shard.turn(tk), shard.done(tk), shard.live(tk), shard.cancel(response_id),
                 shard.recs(tk)]
        rows.append((tk, str(version), outcome.status, msgpack_str(outcome.outputs),
                     msgpack_str(outcome.dead_letters), ids, outcome.ending, late, routed,
                     cut_events(found), spoken, response_id, synthesis_id, attempt_id))
    if options.agui:
        keys.append(shard.agui)
    return ScriptCall(keys, [options.merged_maxlen, options.events_maxlen, options.dlq_maxlen,
                             options.done_ttl, len(settled), options.group, consumer,
                             options.dlq_fields_max, _pack.encode(rows), speaker])


class Opened(NamedTuple):
    """What ``open_turns`` answered."""

    held: dict[TurnKey, bool]  # each turn asked: held by the caller now (else old)
    started: str  # Redis's time, ms


async def open_turns(script: Script, call: ScriptCall, turns: list[TurnKey]) -> Opened:
    """Run ``open_turns`` for ``turns`` (as ``build_open`` was given them)."""
    statuses, started = await script(keys=call.keys, args=call.args)
    return Opened(parse_opened(turns, statuses), as_text(started))


class HeldEnd(IntEnum):
    """What ``finalise_held`` (or ``checkpoint_held``) did with a turn."""

    PUBLISHED = 1  # (checkpoint_held: checkpointed)
    GONE = 0  # already done, or gone
    CHANGED = -1  # another consumer stored into it: spilled
    HELD_ELSEWHERE = 2  # another consumer holds an older entry of it
    CANCELLED = 3  # cancelled before its end was published: spilled, cut at the end


async def finalise_held(script: Script, call: ScriptCall) -> list[HeldEnd]:
    """Run ``finalise_held``: one outcome per turn, in the call's order."""
    return [HeldEnd(int(r)) for r in await script(keys=call.keys, args=call.args)]


async def checkpoint_held(script: Script, call: ScriptCall) -> list[HeldEnd]:
    """Run ``checkpoint_held``: one outcome per turn, in the call's order."""
    return [HeldEnd(int(r)) for r in await script(keys=call.keys, args=call.args)]
