"""What a shard loop checks between batches (``Sweeper``, one part of a
worker): turns made ready, timed out or cancelled while no entry came
(``sweep_shard``), and cancelled turns a finalise left waiting for their
cut (``cancelled_turns``); the turns found are published by the held path
if held there, else finalised by the stored path."""

from __future__ import annotations

from collections.abc import Mapping

from processor.engine.replay import Reason
from processor.scripts.sweep_calls import (
    CancelsDue,
    SweepSlice,
    build_cancelled,
    build_sweep,
    cancelled_turns,
    sweep_shard,
)
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.held.path import HeldPath
from processor.worker.shard_state import ShardState
from processor.worker.shell import Shell
from processor.worker.stored.finalising import Finaliser

__all__ = ["CANCEL_CYCLE_S", "Sweeper", "cancel_slice"]


# Every active turn's cancel key is read at least once per this many seconds,
# whatever their number: a cancel's terminal event is due within 1 s (p99).
CANCEL_CYCLE_S = 0.5


def cancel_slice(active: int, configured: int, sweep_interval: float) -> int:
    """How many cancel keys one sweep reads (one MGET): at least ``configured``,
    more when the shard has so many active turns that slices of that size
    would take longer than ``CANCEL_CYCLE_S`` to go round them all."""
    sweeps_per_cycle = max(1, int(CANCEL_CYCLE_S / max(sweep_interval, 1e-3)))
    return max(configured, -(-active // sweeps_per_cycle))


class Sweeper:
    """Sweeps a worker's shards and retries the cancels left waiting."""

    def __init__(self, shell: Shell, shards: Mapping[int, ShardState], held: HeldPath,
                 finaliser: Finaliser) -> None:
        self.shell = shell
        self.shards = shards
        self.held = held
        self.finaliser = finaliser

    async def sweep(self, shard: Shard, whole: bool = True) -> None:
        """Finalise turns made ready, timed out or cancelled while no entry
        came; with ``whole=False`` (a shard this worker does not read) only
        the cancelled ones."""
        cfg = self.shell.config
        state = self.shards[shard.index]
        start = state.cursor
        # Sized from the active count the last sweep saw (this one learns it).
        size = cancel_slice(state.active, cfg.cancel_slice,
                            cfg.sweep_interval)
        found = await sweep_shard(self.shell.scripts.sweep_shard, build_sweep(shard, SweepSlice(
            cfg.group, int(cfg.limits.turn_timeout * 1000),
            self.shell.options.ready_limit if whole else 0, start, size, cfg.consumer,
            state.floor())))
        state.swept(start, size, found.sliced, found.active)
        todo: dict[TurnKey, Reason] = dict.fromkeys(found.ready, "closing")
        for key in found.cancelled:
            todo.setdefault(key, "cancel")
        for key in found.expired:
            todo.setdefault(key, "timeout")
        await self.held.publish_held_ends(shard, todo)
        if todo:
            await self.finaliser.finalise(shard, todo)

    async def _cancelled(
        self, shard: Shard, turns: list[TurnKey]
    ) -> CancelsDue:
        """Of ``turns``, the cancelled ones to finalise now, and those that must
        wait (``cancelled_turns``: another worker holds them, or an entry up to
        their cut is still pending)."""
        cfg = self.shell.config
        call = build_cancelled(shard, turns, cfg.group, cfg.consumer,
                               self.shards[shard.index].floor())
        return await cancelled_turns(self.shell.scripts.cancelled_turns, call, turns)

    async def retry_cancels(self, shard: Shard) -> None:
        """Finalise the cancelled turns a finalise left waiting for an entry up
        to their cut (docs/design.md, *Cancellation*), as soon as they can be:
        the next step after the entry is applied, not the next sweep."""
        waiting = self.shards[shard.index].waiting_cancels
        if not waiting:
            return
        turns = list(waiting)
        ready, still = await self._cancelled(shard, turns)
        self.shards[shard.index].cancels_still_waiting(still)
        if ready:
            todo: dict[TurnKey, Reason] = {key: "cancel" for key in ready}
            await self.held.publish_held_ends(shard, todo)
            if todo:
                await self.finaliser.finalise(shard, todo)
