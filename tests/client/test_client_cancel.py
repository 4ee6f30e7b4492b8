"""processor.client against a real Redis: the Producer's cancel keys (set with a
TTL, by response id or turn id) and its cancellation watch (stops or interrupts
a generator, polls per interval, reads a bounded prefix of the reason)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from support.records import init_namespace

from processor.client import Producer
from processor.wire.ids import response_id_for_turn, shard_of
from processor.wire.keys import Namespace

# --------------------------------------------------------------------------- cancellation


async def test_cancel_sets_the_key_with_a_ttl(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 4)
    producer = Producer(async_redis_client, namespace, shards=4)
    assert not await producer.cancelled("resp_c")
    await producer.cancel("resp_c", reason="user", ttl=120)
    key = Namespace(namespace, 4).shard_for("resp_c").cancel("resp_c")
    assert key == f"{{{namespace}:{shard_of('resp_c', 4)}}}:cancel:resp_c"
    assert await async_redis_client.get(key) == b"user"
    assert 0 < await async_redis_client.ttl(key) <= 120
    assert await producer.cancelled("resp_c")


async def test_cancel_by_turn_id_uses_the_assigned_response_id(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 4)
    producer = Producer(async_redis_client, namespace, shards=4)
    await producer.cancel(None, turn_id="turn-9")
    rid = response_id_for_turn("turn-9")
    key = Namespace(namespace, 4).shard_for("turn-9").cancel(rid)
    assert await async_redis_client.get(key) == b"cancelled"
    assert await producer.cancelled(None, turn_id="turn-9")


class _CountingClient:
    """Proxy that counts the reads of a key (pipelines of them count once)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.gets = 0

    async def get(self, key: str) -> Any:
        self.gets += 1
        return await self.client.get(key)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        self.gets += 1
        return self.client.pipeline(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


async def test_watch_stops_a_generator_after_cancel(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[int]:
        try:
            n = 0
            while True:
                await asyncio.sleep(0.01)
                yield n
                n += 1
        finally:
            closed.set()

    seen: list[int] = []

    async def consume() -> None:
        async for n in (watch := producer.watch("resp_w", endless(), poll_interval=0.05)):
            seen.append(n)
            if n == 5:
                await producer.cancel("resp_w")
        assert watch.cancelled and watch.reason == "cancelled"

    await asyncio.wait_for(consume(), timeout=10)
    assert closed.is_set()
    assert seen[:6] == list(range(6))


async def test_watch_interrupts_a_stalled_generator(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    closed = asyncio.Event()

    async def stalls() -> AsyncIterator[str]:
        try:
            yield "first"
            await asyncio.Event().wait()  # a model that never answers
            yield "never"
        finally:
            closed.set()

    watch = producer.watch("resp_stall", stalls(), poll_interval=0.05)
    assert await anext(watch) == "first"
    canceller = asyncio.get_running_loop().call_later(
        0.1, lambda: asyncio.ensure_future(producer.cancel("resp_stall", reason="stop"))
    )
    rest = await asyncio.wait_for(_collect(watch), timeout=10)
    canceller.cancel()
    assert rest == []
    assert closed.is_set()
    assert watch.reason == "stop"


async def test_watch_cancel_before_start_yields_nothing(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    await producer.cancel("resp_early")

    async def updates() -> AsyncIterator[int]:
        yield 1

    watch = producer.watch("resp_early", updates())
    assert await _collect(watch) == []
    assert watch.cancelled


async def test_watch_polls_per_interval_not_per_update(async_redis_client, namespace):
    counting = _CountingClient(async_redis_client)
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(counting, namespace)

    async def fast() -> AsyncIterator[int]:
        for n in range(2000):
            yield n

    watch = producer.watch("resp_fast", fast(), poll_interval=10)
    assert len(await _collect(watch)) == 2000
    assert counting.gets == 1
    assert not watch.cancelled


async def test_watch_as_context_manager_closes_the_generator(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    closed = asyncio.Event()

    async def updates() -> AsyncIterator[int]:
        try:
            for n in range(10):
                yield n
        finally:
            closed.set()

    async with producer.watch("resp_ctx", updates(), poll_interval=10) as watch:
        assert await anext(watch) == 0
    assert closed.is_set()
    assert await _collect(watch) == []


async def test_stream_through_watch_ends_cleanly_on_cancel(async_redis_client, namespace):
    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)

    async def updates() -> AsyncIterator[dict[str, Any]]:
        for n in range(1000):
            if n == 3:
                await producer.cancel("resp_sw")
            yield {"contents": [{"type": "text", "text": str(n)}]}
            await asyncio.sleep(0.01)

    sent = await producer.stream("resp_sw", producer.watch("resp_sw", updates(), 0.02))
    assert 3 <= sent.updates < 1000


async def _collect(iterator: Any) -> list[Any]:
    return [item async for item in iterator]


async def test_watch_reads_only_a_prefix_of_a_huge_reason(async_redis_client, namespace):
    """A cancel key's value is anyone's to set (docs/contract.md §6): a
    watching producer reads at most REASON_BYTES of it, however large."""
    from processor.client.watch import REASON_BYTES

    await init_namespace(async_redis_client, namespace, 1)
    producer = Producer(async_redis_client, namespace)
    await producer.ready()
    await async_redis_client.set(producer.cancel_key("resp_huge"), "x" * (8 << 20))

    async def one() -> AsyncIterator[int]:
        yield 1

    watch = producer.watch("resp_huge", one(), poll_interval=0.05)
    assert [n async for n in watch] == []
    assert watch.cancelled and watch.reason == "x" * REASON_BYTES
    await async_redis_client.set(producer.cancel_key("resp_empty"), "")
    watch = producer.watch("resp_empty", one(), poll_interval=0.05)
    assert [n async for n in watch] == [] and watch.cancelled and watch.reason == ""
