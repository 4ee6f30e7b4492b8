"""``connections.handed_over``: after it, a command started as a task is
with redis-server, so the worker's Python runs while the server runs the
command (the mirrors fed during ``apply_entries``: ``StoredPath._follow_ahead``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis

from processor.redis_io.connections import connect, handed_over
from processor.redis_io.options import RedisOptions


async def test_a_command_started_as_a_task_is_with_the_server_after_handed_over(
    redis_url: str, namespace: str
) -> None:
    """The worker's own client, as ``processor run`` makes it. A blocking
    client then polls for the command's effect without yielding to the event
    loop: only a command already written can run meanwhile (with one yield
    it never does, and the poll times out)."""
    client = await connect(RedisOptions(redis_url))
    blocking = redis.Redis.from_url(redis_url)
    script = client.register_script("redis.call('SET', KEYS[1], ARGV[1]) return 1")
    key = f"{namespace}:handed-over"
    try:
        await script(keys=[key], args=["loaded"])  # loaded: one EVALSHA, no NOSCRIPT retry
        for attempt in range(20):
            running = asyncio.ensure_future(script(keys=[key], args=[str(attempt)]))
            await handed_over()
            seen = _poll(blocking, key, str(attempt).encode())
            await running
            assert seen == str(attempt).encode(), f"attempt {attempt}: not sent yet"
    finally:
        blocking.delete(key)
        blocking.close()
        await client.aclose()


def _poll(blocking: redis.Redis, key: str, expected: bytes, seconds: float = 2.0) -> Any:
    """``key``'s value once it is ``expected``, or as it is after ``seconds``
    (blocking: the event loop does not run meanwhile)."""
    deadline = time.monotonic() + seconds
    while (value := blocking.get(key)) != expected and time.monotonic() < deadline:
        time.sleep(0.001)
    return value
