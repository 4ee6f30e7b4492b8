"""Graceful shutdown while entries flow: ``stop()`` (in process) and SIGTERM
(``processor run``) finish and ack what was read, exit cleanly (status 0),
leave the consumer group, and lose nothing: the other workers merge every
turn exactly once, as ``processor merge`` does."""

from __future__ import annotations

import asyncio
import random

from support.strategies import random_turn
from support.turn_reference import compare_with_offline, interleave, offline_results, simple_turn
from support.worker_harness import Harness

from processor.embedded import free_port

TURNS = 300


def _stream(seed: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    return interleave([random_turn(rng, f"{prefix}-{i:04d}") for i in range(TURNS)], rng)


async def _produce(harness: Harness, stream: list[dict]) -> None:
    for start in range(0, len(stream), 100):
        await harness.add(stream[start : start + 100])
        await asyncio.sleep(0.02)


async def _assert_left_group(harness: Harness, consumer: str) -> None:
    for shard in harness.shards:
        pending = await harness.client.xpending_range(
            shard.updates, harness.group, min="-", max="+", count=10, consumername=consumer
        )
        assert pending == [], f"{consumer} left entries pending on shard {shard.index}"
        assert consumer not in await harness.consumers(shard), f"{consumer} still in the group"


async def _wait_served(harness: Harness, consumer: str) -> None:
    """Until the consumer has been delivered entries (Redis 6.2 creates a
    consumer at its first delivery), so that leaving the group means something."""

    async def served() -> bool:
        for shard in harness.shards:
            if consumer in await harness.consumers(shard):
                return True
        return False

    await harness.wait_for(served, 30, f"{consumer} never got an entry")


async def test_stop_while_entries_flow(redis_url: str, namespace: str) -> None:
    stream = _stream(21, "stop")
    offline = offline_results(stream)
    async with Harness(redis_url, namespace, shards=2, batch=50) as harness:
        leaving, staying = await harness.start_workers(2)
        producer = asyncio.create_task(_produce(harness, stream))
        # Stop one worker once both have applied a good part of the flow.
        await harness.wait_merged(TURNS // 4)
        await _wait_served(harness, leaving.consumer)
        await harness.stop_worker(leaving)  # run() returns without raising
        await _assert_left_group(harness, leaving.consumer)
        await producer
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        await harness.stop_worker(staying)
        await _assert_left_group(harness, staying.consumer)
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    compare_with_offline(outputs, offline, "stop()")
    assert outputs.dlq == []


async def test_sigterm_while_entries_flow(redis_url: str, namespace: str, tmp_path) -> None:
    stream = _stream(22, "term")
    offline = offline_results(stream)
    flags = {"batch": 50, "reclaim_idle_ms": 60_000}  # nothing may need a reclaim
    async with Harness(redis_url, namespace, shards=2, log_dir=tmp_path) as harness:
        first, second = harness.spawn(**flags), harness.spawn(**flags)
        await harness.wait_started([first, second])
        producer = asyncio.create_task(_produce(harness, stream))
        await harness.wait_merged(TURNS // 4)
        await _wait_served(harness, first.consumer)
        code = harness.terminate(first)
        assert code == 0, first.log()[-2000:]
        await _assert_left_group(harness, first.consumer)
        third = harness.spawn(**flags)  # a rolling restart
        await producer
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        for sub in (second, third):
            assert harness.terminate(sub) == 0, sub.log()[-2000:]
            await _assert_left_group(harness, sub.consumer)
        outputs = await harness.outputs()
        assert await harness.state_keys() == []
    compare_with_offline(outputs, offline, "SIGTERM")
    assert outputs.dlq == []
    assert '"stopped cleanly"' in first.log()


async def test_stop_while_redis_is_down(make_redis_server, namespace: str) -> None:
    """A worker told to stop while Redis is unreachable does not wait for
    Redis to come back: run() returns (what it had read stays pending in
    Redis for another worker to reclaim)."""
    server = make_redis_server()
    async with Harness(server.url, namespace) as harness:
        running = await harness.start_worker()
        await harness.add(simple_turn("before", 3))
        await harness.wait_drained()
        server.stop()
        running.worker.stop()
        # Without the fix this waits for Redis forever; 60 s is only a guard.
        await asyncio.wait_for(asyncio.shield(running.task), 60)
        harness.workers.remove(running)
        await running.client.aclose()
        server.start()


async def test_sigterm_right_after_spawn(redis_url: str, namespace: str, tmp_path) -> None:
    """A SIGTERM sent before the worker got anywhere (Kubernetes may stop a
    pod at any moment) is a clean stop, not a death by signal: the harness
    spawns with the signal blocked, so it always lands before the handler."""
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness:
        sub = harness.spawn()
        code = harness.terminate(sub)
        assert code == 0, sub.log()[-2000:]
    assert '"stopped cleanly"' in sub.log()


async def test_sigterm_while_redis_is_unreachable(
    redis_url: str, namespace: str, tmp_path
) -> None:
    """A worker still retrying its first connection stops on SIGTERM at once,
    with status 0, instead of dying or waiting for Redis."""
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness:
        sub = harness.spawn(None, "--redis-url", f"redis://127.0.0.1:{free_port()}")

        async def retrying() -> bool:
            return '"redis unreachable, retrying"' in sub.log()

        await harness.wait_for(retrying, 30, "the worker never tried to connect")
        code = harness.terminate(sub)
        assert code == 0, sub.log()[-2000:]
    assert '"stopped cleanly"' in sub.log()
    assert '"worker started"' not in sub.log()


async def test_a_reader_that_fails_while_stopping_does_not_hang_the_stop(
    redis_url: str, namespace: str
) -> None:
    """The shard loop's reader task ends with an error (here a stray
    CancelledError) just as the worker stops: the applier still applies what
    was read, notices the reader is gone and returns, so run() returns."""
    async with Harness(redis_url, namespace) as harness:
        running = await harness.start_worker()
        worker = running.worker
        await harness.add(simple_turn("before", 3))
        await harness.wait_merged(1)
        runner = worker.runner(0)
        real = runner.read

        async def stop_then_fail(*args: object) -> object:
            runner.read = real
            worker.stop()
            raise asyncio.CancelledError("stray")

        runner.read = stop_then_fail
        await asyncio.wait_for(asyncio.shield(running.task), 10)
        harness.workers.remove(running)
        await running.client.aclose()
        await _assert_left_group(harness, running.consumer)
