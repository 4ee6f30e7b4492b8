"""A shard runner's batches between its reader and its apply loop
(``ShardRunner``): each batch as read, and the hand-off that keeps the
reader one batch ahead of the applier and no more."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import cached_property

from processor.redis_io.replies import Entry, RawEntry, entries_of
from processor.scripts.stored_calls import ApplyCall
from processor.worker.held.batch import HeldCall


@dataclass
class Batch:
    """Entries read from a shard, as the reply held them, and, when decoding
    them worked, their script call (``ShardRunner._prepare``);
    ``generation``: the worker's when the read began (another one: read
    before the namespace's state was found lost, continuity.py)."""

    entries: list[RawEntry]
    generation: int = 0
    call: ApplyCall | HeldCall | None = None

    @cached_property
    def usual(self) -> list[Entry]:
        """The entries in the usual shape (the stored path's), made once."""
        return entries_of(self.entries)


class Handoff(asyncio.Queue[Batch]):
    """The reader's batches on their way to the apply loop: room for one, and
    the reader waits until the apply loop took it before reading the next.

    So a batch waits behind the one being applied and no more. With only
    the queue's bound the reader held a second batch read while one waited
    in the queue: at half the maximum throughput an entry waited about three
    batch cycles for its turn to be finalised instead of two, for no gain in
    throughput (the overlap that pays is one batch read and decoded while
    another's scripts run in redis-server)."""

    def __init__(self) -> None:
        super().__init__(maxsize=1)
        self._taken = asyncio.Event()

    def _get(self) -> Batch:  # asyncio.Queue's hook for subclasses, under get()
        batch: Batch = super()._get()
        self._taken.set()
        return batch

    async def taken(self) -> None:
        """Until the queue is empty."""
        while not self.empty():
            self._taken.clear()
            await self._taken.wait()


async def next_batch(batches: asyncio.Queue[Batch], reader: asyncio.Task[None]) -> Batch | None:
    """The next batch read, or None once the reader is done (stopped, or
    failed) and every batch it read was taken."""
    while batches.empty():
        if reader.done():
            return None
        getter = asyncio.ensure_future(batches.get())
        try:
            await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
    return batches.get_nowait()
