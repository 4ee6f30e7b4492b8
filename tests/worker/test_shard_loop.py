"""A shard loop's reader stays one batch ahead of its applier, never two: a
batch read waits behind the one being applied and no more (the latency of
a turn's end to its merged entry is about two batch cycles, not three)."""

from __future__ import annotations

import asyncio
from typing import Any

from support.no_redis import NoRedis

from processor.worker.handoff import Batch, Handoff
from processor.worker.worker import Worker, WorkerConfig


async def _turns(n: int = 50) -> None:
    """Let every ready task run, ``n`` times over."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_handoff_tells_the_reader_when_its_batch_was_taken() -> None:
    handoff = Handoff()
    await handoff.put(Batch([]))
    taken = asyncio.create_task(handoff.taken())
    await _turns()
    assert not taken.done()
    handoff.get_nowait()
    await _turns()
    assert taken.done()
    await handoff.taken()  # empty already: returns at once


async def test_the_reader_reads_one_batch_ahead_of_the_applier_and_no_more() -> None:
    worker = Worker(client=NoRedis(), config=WorkerConfig(namespace="handoff-unit"))
    worker.shard(0).orphans = False  # nothing to take back before the first read
    runner = worker.runner(0)
    reads = 0
    applied: list[Any] = []
    release = asyncio.Event()

    async def read() -> list[list[Any]]:  # (as connections.read_raw gives them)
        nonlocal reads
        reads += 1
        return [[f"1-{reads}".encode(), []]]

    async def apply(_shard: Any, batch: Any) -> None:
        applied.append(batch.entries)
        await release.wait()

    runner.read = read
    async def nothing(*_args: Any) -> None:
        pass

    worker.paths.apply_read = apply  # type: ignore[method-assign]
    worker.sweeper.sweep = worker.sweeper.retry_cancels = nothing  # type: ignore[method-assign]
    worker.recovery.reclaim = nothing  # type: ignore[method-assign]
    loop = asyncio.create_task(runner.run())
    try:
        await _turns()
        # The first batch is being applied and the second waits: a reader
        # that read on would have a third in hand by now.
        assert (len(applied), reads) == (1, 2)
        release.set()
        for _ in range(50):
            await asyncio.sleep(0)
            # At most: one the applier has taken (applied, or about to be
            # between its get and the apply call) and one read ahead.
            assert reads - len(applied) <= 2
        assert len(applied) > 10
    finally:
        worker.stop()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
