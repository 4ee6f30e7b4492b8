"""The two paths of a batch a shard runner read (``Paths``, one part of
a worker): held (processor.worker.held.path) or stored
(processor.worker.stored.storing), and entry by entry when the batch
fails, so that one entry that always fails stays pending alone."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from processor.redis_io.connections import is_transient
from processor.redis_io.replies import Entry, as_text
from processor.scripts.stored_calls import ApplyCall
from processor.wire.keys import Shard
from processor.worker.continuity import is_nogroup
from processor.worker.handoff import Batch
from processor.worker.held.batch import HeldCall
from processor.worker.held.path import HeldPath
from processor.worker.shard_state import ShardState
from processor.worker.stored.storing import StoredPath

log = logging.getLogger("processor.worker")


class Paths:
    """Applies the batches of a worker's shards through its held or stored path."""

    def __init__(self, shards: Mapping[int, ShardState], held: HeldPath, stored: StoredPath,
                 hold_turns: bool) -> None:
        self.shards = shards
        self.held = held
        self.stored = stored
        self.hold_turns = hold_turns

    async def apply_read(self, shard: Shard, batch: Batch) -> None:
        """A batch as its shard's runner read it: held when grouped for
        holding (a ``HeldCall``, ``ShardRunner._prepare``), else stored
        (with its call if already built)."""
        call = batch.call
        if isinstance(call, HeldCall):
            await self._isolated(shard, self.held.apply_held(shard, batch.entries, call),
                                 lambda: batch.usual, {})
        else:
            await self.apply_isolated(shard, batch.usual, {}, call)

    async def apply_isolated(self, shard: Shard, entries: list[Entry],
                             deliveries: dict[str, int], call: ApplyCall | None = None) -> None:
        """Store entries (``deliveries``: how often each was delivered, by id,
        if more than once) with ``call`` if already built."""
        await self._isolated(shard, self.stored.store(shard, entries, deliveries, call),
                             lambda: entries, deliveries)

    async def _isolated(self, shard: Shard, batch: Awaitable[None],
                        entries: Callable[[], list[Entry]], deliveries: dict[str, int]) -> None:
        """Apply a batch; if it fails (not a connection error), apply its
        entries one by one, so that one entry that always fails stays pending
        alone (and reaches max_deliveries alone) instead of taking its batch along."""
        try:
            await batch
        except Exception as exc:
            if is_transient(exc) or is_nogroup(exc):  # (the group: continuity.py)
                raise
            if self.hold_turns:
                # Some may stay pending, neither held nor applied: no floor
                # (ShardState.floor) until they are taken back before the next read.
                self.shards[shard.index].reply_lost()
            each = entries()
            if len(each) == 1:
                log.exception("entry failed, left pending for redelivery",
                              extra={"shard": shard.index, "entry_id": as_text(each[0][0])})
                return
            log.exception("batch failed, applying its entries one by one",
                          extra={"shard": shard.index, "count": len(each)})
            for entry in each:
                await self.apply_isolated(shard, [entry], deliveries)
