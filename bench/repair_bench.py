"""How long ``processor repair-stream`` blocks Redis, on a private redis-server.

Builds one shard's updates stream of ``--entries`` entries (an update of
``--size`` bytes each), with the consumer group, ``--pending`` of them
delivered and not acked, and the last possible id added; then times the
repair (one Lua step: Redis answers nothing else meanwhile) and prints the
figures. Nothing is written to docs/.

    python bench/repair_bench.py [--entries 100000] [--pending 1000] [--size 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import redis.asyncio

from processor.embedded import EmbeddedRedis
from processor.scripts.repair import repair
from processor.wire.keys import Namespace

MAX_ID = "18446744073709551615-18446744073709551615"


async def main(entries: int, pending: int, size: int) -> None:
    server = EmbeddedRedis().start()
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        shard = Namespace("bench").shard(0)
        await client.xgroup_create(shard.updates, "processor", id="0", mkstream=True)
        update = '{"contents":[{"type":"text","text":"' + "x" * size + '"}]}'
        for start in range(0, entries, 1000):
            async with client.pipeline(transaction=False) as pipe:
                for i in range(start, min(entries, start + 1000)):
                    pipe.xadd(shard.updates, {"response_id": f"r{i % 500}", "kind": "update",
                                              "update": update})
                await pipe.execute()
        await client.xreadgroup("processor", "w1", {shard.updates: ">"}, count=pending)
        await client.xadd(shard.updates, {"response_id": "evil", "kind": "end"}, id=MAX_ID)
        memory = (await client.info("memory"))["used_memory"]
        started = time.perf_counter()
        result = await repair(client, shard)
        took = time.perf_counter() - started
        peak = (await client.info("memory"))["used_memory_peak"]
        print(f"redis-server {server.version}; {entries:,} entries of a {len(update)}-byte "
              f"update, {pending:,} pending, the last possible id added")
        print(f"repair: {result.status}, {result.dead_lettered} dead-lettered, "
              f"{result.kept:,} kept, in {took * 1000:.0f} ms "
              f"({took / max(1, entries) * 1e6:.2f} µs an entry)")
        print(f"used_memory before {memory / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB")
    finally:
        await client.aclose()
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--size", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.entries, args.pending, args.size))
