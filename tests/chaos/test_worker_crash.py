"""Crashes: ``processor run`` workers are SIGKILLed in the middle of their
batches, several times, while the others go on and the killed one is
restarted. Every turn still ends merged exactly once, equal to ``processor
merge``, nothing is dead-lettered, and no per-turn state is left behind."""

from __future__ import annotations

import asyncio
import json
import random

import redis.asyncio
from support.strategies import random_turn
from support.turn_reference import compare_with_offline, interleave, offline_results
from support.worker_harness import Harness

from processor.wire.models import TURN_IDS
from processor.worker.worker import Worker

TURNS = 600
KILLS = 5
# Short, so that the entries a killed worker held are reclaimed quickly.
RECLAIM_IDLE_MS = 500
WORKER_FLAGS = {
    "reclaim_idle_ms": RECLAIM_IDLE_MS, "batch": 50, "log_level": "info", "progress": True,
}


async def test_sigkill_workers_mid_batch(redis_url: str, namespace: str, tmp_path) -> None:
    rng = random.Random(7)
    turns = [random_turn(rng, f"crash-{i:04d}") for i in range(TURNS)]
    arrival = interleave(turns, random.Random(8))
    offline = offline_results(arrival, progress=True)

    async with Harness(redis_url, namespace, shards=2, log_dir=tmp_path) as harness:
        for _ in range(3):
            harness.spawn(**WORKER_FLAGS)
        await harness.wait_started(harness.procs)

        async def produce() -> None:
            # Small slices with pauses, so the kills land while batches flow.
            for start in range(0, len(arrival), 200):
                await harness.add(arrival[start:start + 200])
                await asyncio.sleep(0.05)

        producer = asyncio.create_task(produce())
        killed = 0
        while killed < KILLS:
            await asyncio.sleep(rng.uniform(0.1, 0.4))
            victim = rng.choice(harness.procs)
            harness.kill(victim)
            killed += 1
            replacement = harness.spawn(**WORKER_FLAGS)
            if killed == KILLS // 2:
                # The killed consumer's pending entries wait until one of the
                # survivors reclaims them; the restart joins meanwhile.
                await harness.wait_started([replacement])
            if killed == 1:
                await _ghost_reads(harness)
            if killed == 3:
                await _dies_before_finalise(harness)
        await producer
        await harness.wait_merged(len(offline), timeout=90)
        await harness.wait_drained(timeout=60)
        harness.assert_workers_alive()
        outputs = await harness.outputs()
        leftover = await harness.state_keys()

    # Every event once, seq gap-free; live progress is best effort across
    # crashes (a turn whose speaker died goes on silent, docs/design.md).
    compare_with_offline(outputs, offline, "after SIGKILLs")
    assert outputs.merged_count == len(offline)
    assert outputs.dlq == [], outputs.dlq[:3]
    assert leftover == [], leftover


async def _ghost_reads(harness: Harness) -> None:
    """A consumer that reads a batch of every shard and dies before applying it:
    its entries stay pending until a live worker reclaims them."""
    for shard in harness.shards:
        await harness.client.xreadgroup(harness.group, "ghost", {shard.updates: ">"}, count=40)


async def _dies_before_finalise(harness: Harness) -> None:
    """A worker that applies a batch of every shard and dies before finalising
    the turns it made ready: a survivor's sweep must finalise them."""
    client = redis.asyncio.Redis.from_url(harness.url)
    try:
        worker = Worker(
            client, harness.worker_config(consumer="applies-only", batch=100, progress=True)
        )

        async def no_finalise(*_args: object) -> None:
            return None

        worker.finaliser.finalise = no_finalise  # type: ignore[method-assign]
        for shard in harness.shards:
            await worker.runner(shard.index).read_once()
    finally:
        await client.aclose()


def _strip(event: dict) -> str:
    drop = {"seq", "ts", *TURN_IDS}
    return json.dumps({k: v for k, v in event.items() if k not in drop}, sort_keys=True)
