"""The live feed (processor/serve/hub.py) on a real Redis: stopping it
while its readers block in XREAD, and reading on across a Redis restart."""

from __future__ import annotations

import asyncio
import random

from redis.exceptions import ConnectionError as RedisConnectionError

from processor.client.turns import LiveEvent, TurnRef
from processor.redis_io.connections import connect
from processor.redis_io.options import RedisOptions
from processor.serve.hub import Hub
from processor.serve.metrics import ServeMetrics
from processor.wire.keys import Namespace


async def test_closing_never_hangs_on_a_blocked_read(redis_url, namespace) -> None:
    """redis-py (8.1, Python 3.11) can swallow the cancellation of a blocking
    XREAD and leave the task waiting on its socket for good: a hub that
    cancelled its readers hung in about one close out of three."""
    rng = random.Random(7)
    for _ in range(40):
        client = await connect(RedisOptions(redis_url))  # new connections, as at start
        try:
            hub = Hub(client, Namespace(namespace, 8), ServeMetrics(), block_ms=100)
            hub.start()
            await asyncio.sleep(rng.random() * 0.3)
            await asyncio.wait_for(hub.close(), 5)
            assert all(task.done() for task in hub._tasks)
        finally:
            await client.aclose()


async def test_the_feed_reads_on_from_where_it_was_across_a_redis_restart(
    make_redis_server, namespace
) -> None:
    server = make_redis_server(appendonly="yes")
    client = await connect(RedisOptions(server.url, socket_timeout=2))
    ns = Namespace(namespace, 1)
    shard = ns.shard(0)
    hub = Hub(client, ns, ServeMetrics(), block_ms=100)
    hub.start()
    try:
        turn = TurnRef("r")
        subscription = await asyncio.wait_for(hub.subscribe(turn, 100), 10)

        async def publish(seq: int) -> None:
            event = f'{{"type":"synthesis.chunk","seq":{seq},"response_id":"r"}}'
            for _ in range(50):  # the pool's connections from before the restart fail once
                try:
                    await client.xadd(shard.events, {"response_id": "r", "event": event})
                    return
                except RedisConnectionError:
                    await asyncio.sleep(0.1)
            raise AssertionError("redis never came back")

        await publish(0)
        first = await subscription.take(10)
        server.restart()  # AOF: the stream, and so the reader's position, survive
        await publish(1)
        await publish(2)
        got: list[LiveEvent] = []
        while len(got) < 2:
            items = await subscription.take(10)
            assert items is not None
            got += [item for item in items if isinstance(item, LiveEvent)]
        assert first is not None and [e.seq for e in first if isinstance(e, LiveEvent)] == [0]
        assert [e.seq for e in got] == [1, 2]
        assert hub.metrics.registry.get_sample_value("processor_serve_redis_errors_total") >= 1
    finally:
        await hub.close()
        await client.aclose()
