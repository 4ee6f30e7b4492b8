"""How many of a replica's requests talk to Redis at once.

redis-py's connection pool refuses a command outright when all its
connections are busy (``MaxConnectionsError``: a 503 for the client). A
burst of joins, every browser reconnecting after a replica restart, used
to get hundreds of those with Redis healthy (``EventSource`` gives up for
good on a non-200). Requests take a ``RedisGate`` slot around their
Redis calls instead: at most ``size`` at once, fewer than the pool holds
(the shard readers keep theirs), the others wait their turn, in order,
for at most ``wait`` seconds (then a 503), each wait measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from prometheus_client import Histogram
from redis.exceptions import TimeoutError as RedisTimeoutError

#: Seconds a request waits for a slot before it is answered 503.
GATE_WAIT = 30.0


class GateTimeout(RedisTimeoutError):
    """No slot came free within the gate's wait: as if Redis did not answer
    in time (a 503 for a request)."""


class RedisGate:
    """At most ``size`` requests' Redis calls at once; the rest wait in order."""

    def __init__(self, size: int, waits: Histogram, wait: float = GATE_WAIT) -> None:
        self.size = size
        self.wait = wait
        self._waits = waits
        self._free = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def slot(self, wait: float | None = None) -> AsyncIterator[None]:
        """Hold a slot (waiting at most ``wait`` s, else the gate's wait)."""
        wait = self.wait if wait is None else wait
        started = time.monotonic()
        try:
            async with asyncio.timeout(wait):
                await self._free.acquire()
        except TimeoutError:
            raise GateTimeout(f"no Redis connection came free within {wait:g} s") from None
        finally:
            self._waits.observe(time.monotonic() - started)
        try:
            yield
        finally:
            self._free.release()
