"""The two paths of a batch a shard runner read (``Paths``, one part of
a worker): held (processor.worker.held.path) or stored
(processor.worker.stored.storing), and entry by entry when the batch
fails, so that one entry that always fails stays pending alone."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from processor.redis_io.connections import is_transient
from processor.redis_io.replies import as_text, stream_entry
from processor.scripts.stored_calls import ApplyCall
from processor.wire.keys import Shard
from processor.worker.continuity import is_nogroup
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

    async def apply_isolated(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | HeldCall | None = None,
    ) -> None:
        """Apply a batch; if it fails (not a connection error), apply its entries
        one by one, so that one entry that always fails stays pending alone
        (and reaches max_deliveries alone) instead of taking its batch along."""
        try:
            await self.process_batch(shard, entries, deliveries, call)
        except Exception as exc:
            if is_transient(exc) or is_nogroup(exc):  # (the group: continuity.py)
                raise
            if self.hold_turns:
                # Some may stay pending, neither held nor applied: no floor
                # (ShardState.floor) until they are taken back before the next read.
                self.shards[shard.index].reply_lost()
            if len(entries) == 1:
                log.exception("entry failed, left pending for redelivery",
                              extra={"shard": shard.index, "entry_id": as_text(entries[0][0])})
                return
            log.exception("batch failed, applying its entries one by one",
                          extra={"shard": shard.index, "count": len(entries)})
            for entry in entries:
                await self.apply_isolated(shard, [entry], deliveries)

    async def process_batch(
        self, shard: Shard, entries: list[tuple[Any, Any]], deliveries: dict[str, int],
        call: ApplyCall | HeldCall | None = None,
    ) -> None:
        """Apply a batch (``call``: its script call, if already built): hold
        it (``processor.worker.held.path``) or store it."""
        if isinstance(call, HeldCall):  # grouped for holding (ShardRunner._prepare)
            await self.held.apply_held(shard, entries, call)
        elif entries and entries[0][1].__class__ is not dict:  # read raw (read_raw)
            await self.stored.store(shard, list(map(stream_entry, entries)), deliveries, call)
        else:
            await self.stored.store(shard, entries, deliveries, call)
