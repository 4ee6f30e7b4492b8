"""Redis memory across a run and a drain (tests/worker/test_worker_memory.py and
bench/memory_drain.py): ``used_memory`` before, at the peak and after the
outputs are read and the done markers expire."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from support.turn_reference import simple_turn
from support.worker_harness import Harness


@dataclass
class MemoryFigures:
    updates: int
    turns: int
    before: int  # used_memory once warmed up and drained
    peak: int  # used_memory when every entry was applied, before finalising was over
    after: int  # used_memory after the run, the drain and the done TTL

    @property
    def growth(self) -> int:
        return self.after - self.before


async def used_memory(client: Any) -> int:
    return int((await client.info("memory"))["used_memory"])


async def drain_outputs(harness: Harness, done_ttl: float) -> None:
    """What a downstream consumer and time do once a run is over: the output
    streams are read and deleted (as a consumer that trims them would), and
    the finished turns' ``done`` markers expire after their TTL."""
    for shard in harness.shards:
        await harness.client.delete(shard.merged, shard.events, shard.dlq)
    await asyncio.sleep(done_ttl)

    async def expired() -> bool:
        # SCAN also expires the keys it meets, so this converges quickly.
        for shard in harness.shards:
            async for _key in harness.client.scan_iter(match=f"{shard.tag}:done:*", count=1000):
                return False
        return True

    await harness.wait_for(expired, 30 + done_ttl, "done markers did not expire")


async def memory_drain(
    harness: Harness, updates: int, per_turn: int = 20, done_ttl: float = 1.0,
    chunk: int = 5000,
) -> MemoryFigures:
    """Run ``updates`` updates through the harness's (already started) workers
    and return ``used_memory`` before, at the peak and after the drain.
    The workers must run with ``done_ttl=done_ttl``."""
    # Warm up (scripts loaded, groups, consumers, connection buffers), then drain.
    await harness.add(simple_turn("warm-up", per_turn))
    await harness.wait_merged(1)
    await harness.wait_drained()
    await drain_outputs(harness, done_ttl)
    before = await used_memory(harness.client)

    turns = max(1, updates // per_turn)
    entries: list[dict[str, Any]] = []
    for t in range(turns):
        entries += simple_turn(f"mem-{t:06d}", per_turn)
    peak = before
    for start in range(0, len(entries), chunk):
        await harness.add(entries[start:start + chunk])
        peak = max(peak, await used_memory(harness.client))
    await harness.wait_merged(turns, timeout=600)
    await harness.wait_drained(timeout=600)
    peak = max(peak, await used_memory(harness.client))
    await drain_outputs(harness, done_ttl)
    after = await used_memory(harness.client)
    return MemoryFigures(turns * per_turn, turns, before, peak, after)
