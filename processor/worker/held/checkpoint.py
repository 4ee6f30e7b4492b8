"""Checkpointing held turns (``checkpoint_held``, docs/design.md *Held
turns*): a turn held ``--hold-ms`` and still running has its merge stored as
a snapshot and its entries acked, and stays held, instead of being spilled
to the stored path. ``Checkpointer`` is the held path's
(``processor.worker.held.path.HeldPath``), which calls it for the turns due,
with no finalise of the shard in flight."""

from __future__ import annotations

from collections.abc import Mapping

from processor.engine.records import snapshot
from processor.scripts.held_calls import (
    HeldCheckpoint,
    HeldEnd,
    build_checkpoint_held,
    checkpoint_held,
)
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.held.per_call import in_calls
from processor.worker.live_progress import LivePublisher, nothing
from processor.worker.shard_state import ShardState
from processor.worker.shell import Retrying, Shell


class Checkpointer:
    """The checkpoints of a worker's held turns."""

    def __init__(self, shell: Shell, shards: Mapping[int, ShardState], live: LivePublisher,
                 retrying: Retrying) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.shards = shards
        self.live = live
        self.retrying = retrying

    async def checkpoint(self, shard: Shard, keys: list[TurnKey], now: float) -> list[TurnKey]:
        """Checkpoint the turns of ``keys`` held ``--hold-ms`` or longer that
        are still running (``checkpoint_held``): each one's merge is stored
        as a snapshot and its entries acked, and it stays held, held again
        from ``now``. Their live progress is said first, so that the live
        log holds every update the snapshot does. None while entries
        this worker does not know of may be pending here. Returns the turns
        to spill: the others (over the bounds, broken or ended) and any the
        script refused."""
        holds = self.shards[shard.index].holds
        hold_s = self.shell.config.hold_ms / 1000
        aged: list[TurnKey] = []
        rest: list[TurnKey] = []
        for key in keys:
            held = holds.turns.get(key)
            if held is None:
                continue
            if (now - held.since >= hold_s and held.ids and not held.broken
                    and held.replay.life.outcome is None):
                aged.append(key)
            else:
                rest.append(key)
        if not aged:
            return rest
        if self.shards[shard.index].unknown_pending():
            # An entry pending here that this worker neither holds nor has
            # applied (a claim's or a read's reply lost) may be an older one
            # of an aged turn: its snapshot would miss it, and the replay put
            # it after. They stay held until the take-back before the next
            # read, and are checkpointed (or refused and spilled) after it.
            return rest
        if self.shell.config.progress:
            await self.live.publish_live_held(shard, aged, nothing, force=True)
        turns: list[HeldCheckpoint] = []
        for key in aged:
            held = holds.turns.get(key)
            if held is None or not held.catch_up() or held.replay.life.outcome is not None:
                if held is not None:
                    rest.append(key)
                continue
            life, cover = held.replay.life, held.ids[-1]
            turns.append(HeldCheckpoint(
                key, held.version, held.version + len(held.ids), life.counts.updates, life.bytes,
                snapshot(life, cover), cover, list(held.ids), dict(life.turn.state.ids)))
        for part in in_calls(turns, lambda turn: len(turn.ids), self.shell.config.batch):
            rest += await self._checkpoint(shard, part, now)
        return rest

    async def _checkpoint(self, shard: Shard, turns: list[HeldCheckpoint],
                          now: float) -> list[TurnKey]:
        """One ``checkpoint_held`` call, committed; returns the turns it refused."""
        holds = self.shards[shard.index].holds
        call = build_checkpoint_held(shard, turns, self.shell.options, self.shell.config.consumer)

        async def checkpoint() -> list[HeldEnd]:
            return await checkpoint_held(self.shell.scripts.checkpoint_held, call)

        refused: list[TurnKey] = []
        for turn, result in zip(turns, await self.retrying(checkpoint), strict=True):
            held = holds.turns.get(turn.key)
            if held is None:
                continue
            if result is not HeldEnd.PUBLISHED:
                refused.append(turn.key)
                continue
            holds.checkpointed(turn.key, turn.after, turn.snapshot, now)
            self.shell.metrics.stored.inc(len(turn.ids))  # (applied: in the snapshot)
        if len(refused) < len(turns):
            self.shell.metrics.checkpointed.inc(len(turns) - len(refused))
        return refused
