"""The limit: a raw drain of a stream, no processing.

``XREADGROUP COUNT 500`` then ``XACK`` of the batch, until ``EXPECTED``
entries are acked; the same client library (redis-py asyncio with hiredis)
as the worker. Run as a process, like a worker; prints ``ready`` once its
group exists, then, when done, ``done <Redis time in ms>``::

    python bench/drain.py REDIS_URL STREAM EXPECTED [--group G] [--count 500]
"""

from __future__ import annotations

import argparse
import asyncio

import redis.asyncio
from redis.exceptions import ResponseError


async def ready(client: redis.asyncio.Redis, stream: str, group: str) -> None:
    """Create the consumer group (if missing), then say ``ready``."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    print("ready", flush=True)


async def drain_group(client: redis.asyncio.Redis, stream: str, group: str, expected: int,
                      count: int = 500) -> None:
    """Read and ack ``expected`` entries of ``stream`` through ``group``: the limit's loop."""
    acked = 0
    while acked < expected:
        reply = await client.xreadgroup(group, "drain", {stream: ">"}, count=count, block=100)
        for _name, entries in reply or []:
            if entries:
                acked += await client.xack(stream, group, *(i for i, _f in entries))


async def drain(url: str, stream: str, expected: int, group: str, count: int) -> None:
    client = redis.asyncio.Redis.from_url(url)
    await ready(client, stream, group)
    await drain_group(client, stream, group, expected, count)
    seconds, micros = await client.time()
    print(f"done {int(seconds) * 1000 + int(micros) // 1000}", flush=True)
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("expected", type=int)
    parser.add_argument("--group", default="processor")
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(drain(args.url, args.stream, args.expected, args.group, args.count))


if __name__ == "__main__":
    main()
