"""Spilling held turns (docs/design.md *Held turns*): when holding a turn
stops being safe or cheap, its entries go to ``apply_entries`` (the stored
path), which stores and acks them, and the turn is a stored turn from then
on; and the idle time of what stays held is reset, so that no other worker
reclaims it. ``Spiller`` is the held path's
(``processor.worker.held.path.HeldPath``), which decides what spills and
when, with no finalise of the shard in flight."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from processor.engine.replay import resumed
from processor.redis_io.client import ids_arg
from processor.redis_io.replies import Entry, entries_of
from processor.wire.ids import TurnKey
from processor.wire.keys import Shard
from processor.worker.continuity import Continuity
from processor.worker.live_progress import LivePublisher
from processor.worker.shard_state import ShardState
from processor.worker.shell import Shell
from processor.worker.stored.storing import StoredPath

log = logging.getLogger("processor.worker")


class Spiller:
    """The spills and idle-time refreshes of a worker's held turns."""

    def __init__(self, shell: Shell, shards: Mapping[int, ShardState], stored: StoredPath,
                 continuity: Continuity, live: LivePublisher) -> None:
        self.shell = shell  # (the worker's client, settings, scripts and metrics, shared)
        self.shards = shards
        self.stored = stored
        self.continuity = continuity
        self.live = live  # (a spilled turn's live state goes with it: hand_over)

    async def spill(self, shard: Shard, keys: list[TurnKey], why: str) -> None:
        """Hand the held turns of ``keys`` to apply_entries: their entries
        are stored and acked there (the XACK fence skips any that were
        applied already), and the turns go on as any stored turn."""
        holds = self.shards[shard.index].holds
        if not any(key in holds.turns for key in keys):
            return
        # A turn refused at its publish, or held too long, may be one whose
        # state Redis lost: then it is published from memory (continuity.py).
        if await self.continuity.namespace_lost("spilling held turns"):
            await self.continuity.lose_shard_now(shard)
            return
        # In calls of whole turns, each of about a read batch (--batch): all
        # of a worker's due turns in one apply_entries call (1,000 turns held
        # 5 s at one update per 100 ms: 50,000 entries) kept redis-server busy
        # for seconds, every other client waiting (2.5 s seen). A turn's
        # entries stay in one call: its first publish after the spill skips
        # what its live log holds already (live_progress.py, hand_over). A turn
        # is taken out of the holds only for its own call: until then it is
        # held, so that a finalise of the calls before (which spills the held
        # turns it finalises first, spill_ready) never takes it for stored.
        chunk: list[TurnKey] = []
        size = spilled = calls = 0
        try:
            for key in keys:
                held = holds.turns.get(key)
                if held is None:
                    continue  # (spilled meanwhile by a call before: spill_ready)
                if chunk and size + len(held.entries) > self.shell.config.batch:
                    spilled += await self._store_held(shard, chunk)
                    calls += 1
                    chunk, size = [], 0
                chunk.append(key)
                size += len(held.entries)
            if chunk:
                spilled += await self._store_held(shard, chunk)
                calls += 1
        finally:
            if spilled:
                self.shell.metrics.spilled.inc(spilled)
                log.info("spilled held turns", extra={"shard": shard.index, "turns": spilled,
                                                      "calls": calls, "why": why})

    async def _store_held(self, shard: Shard, keys: list[TurnKey]) -> int:
        """Take held turns out of the holds and store their entries in one
        ``apply_entries`` call; returns how many turns."""
        state = self.shards[shard.index]
        holds = state.holds
        entries: list[Entry] = []
        taken = 0
        for key in keys:
            held = holds.take(key)
            if held is not None:
                taken += 1
                holds.old.add(key)
                if held.checkpoint:  # the stored path follows it from its checkpoint
                    state.mirrors.adopt(
                        key, resumed(key, self.shell.config.limits, held.checkpoint), held,
                        held.checkpoint_id)
                self.live.hand_over(shard, key, held.shown, held.logged, held.spoken)
                entries += entries_of(held.entries)
        if entries:
            try:
                # (What it has read ahead and not routed counts as read
                # after a cancel this call may be the first to meet.)
                await self.stored.store(shard, entries, {}, None, state.read_ahead_from())
            except BaseException:
                # No longer held, maybe not applied: taken back before the
                # next read, and no floor until then (ShardState.floor).
                state.reply_lost()
                raise
        return taken

    async def refresh(self, shard: Shard, ids: list[str]) -> None:
        """``XCLAIM ... JUSTID`` held entries to this consumer: their idle
        time starts again and their delivery count stays, so no worker
        reclaims them while this one is alive. One reclaimed meanwhile (this
        worker was slow) is taken back; whoever acks it first applies it
        (the XACK fence), and a turn another worker stored into is refused at
        finalise_held and spilled."""
        cfg = self.shell.config
        for i in range(0, len(ids), 1000):
            await self.shell.client.xclaim(shard.updates, cfg.group, cfg.consumer, 0,
                                           ids_arg(ids[i:i + 1000]), justid=True)
