"""Stopping a generator when its turn's cancellation key appears (docs/contract.md §6)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from processor.client.closing import AsyncClosing
from processor.redis_io.connections import is_transient
from processor.redis_io.replies import as_text

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

# The name the logger had before processor.client became a package: log filters keep working.
log = logging.getLogger("processor.client")

T = TypeVar("T")


async def _next(iterator: AsyncIterator[T]) -> T:
    """``anext`` as a coroutine, so a Task can run it."""
    return await anext(iterator)


#: The most of a cancellation key's value (the reason) a watch reads: anyone
#: may set the key, to a value of any size.
REASON_BYTES = 1024


class CancelWatch(AsyncClosing, Generic[T]):
    """An async iterator over ``updates`` that ends when a cancellation key appears.

    It reads the key at most once per poll interval while it is iterated (no
    background task outlives it). When the key is seen, the pending ``anext``
    of the source is cancelled, the source is ``aclose()``-d, the iteration
    ends, and ``reason`` holds the key's value. Use ``async with`` (or
    ``aclose``) when you may stop iterating early.
    """

    def __init__(self, client: RedisClient, key: str | Callable[[], Awaitable[str]],
                 updates: AsyncIterable[T], poll_interval: float):
        """Watch ``key`` on ``client`` while iterating ``updates`` (``key`` may
        be a coroutine function giving it, awaited at the first poll: the
        producer learns a turn's shard from the namespace's record)."""
        self._client = client
        self._key: str | None = key if isinstance(key, str) else None
        self._key_of = key
        self._source = updates
        self._iterator = aiter(updates)
        self._interval = poll_interval
        self._next_poll = 0.0
        self._closed = False
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """True once the cancellation key was seen."""
        return self.reason is not None

    def __aiter__(self) -> CancelWatch[T]:
        """The watch itself."""
        return self

    async def __anext__(self) -> T:
        """The next update, or ``StopAsyncIteration`` when exhausted or cancelled."""
        if self._closed:
            raise StopAsyncIteration
        step = asyncio.ensure_future(_next(self._iterator))
        try:
            while not await self._step_done(step):
                if await self._poll():
                    await self._stop(step)
                    raise StopAsyncIteration
        except asyncio.CancelledError:
            step.cancel()
            raise
        return step.result()

    async def _step_done(self, step: asyncio.Future[T]) -> bool:
        """Wait for ``step`` until the next poll is due; True when it finished first."""
        delay = self._next_poll - asyncio.get_running_loop().time()
        if delay <= 0:
            return False
        done, _ = await asyncio.wait({step}, timeout=delay)
        return bool(done)

    async def _poll(self) -> bool:
        """Read the key once (a transient error counts as "not cancelled")."""
        self._next_poll = asyncio.get_running_loop().time() + self._interval
        key = self._key
        if key is None:
            key = self._key = await self._key_of() if callable(self._key_of) else self._key_of
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.exists(key)
                pipe.getrange(key, 0, REASON_BYTES - 1)
                found, value = await pipe.execute()
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("could not read the cancellation key %s: %s", self._key, exc)
            return False
        if not found:
            return False
        self.reason = as_text(value)
        return True

    async def _stop(self, step: asyncio.Future[T]) -> None:
        """Interrupt the pending ``anext`` and close the source."""
        step.cancel()
        await asyncio.wait({step})
        if not step.cancelled():
            step.exception()  # retrieved: it is superseded by the cancellation
        await self.aclose()

    async def aclose(self) -> None:
        """Stop iterating and ``aclose()`` the source (when it has one)."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self._source, "aclose", None)
        if close is not None:
            await close()
