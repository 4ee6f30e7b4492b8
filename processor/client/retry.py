"""Retries after transient Redis/network errors, shared by the producer and subscriber."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from processor.redis_io.connections import is_transient

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Retries after what the worker also retries
    (``processor.redis_io.connections.is_transient``:
    connection errors and cluster hiccups such as CLUSTERDOWN or TRYAGAIN),
    with exponential backoff and full jitter.

    The ``n``-th wait is uniform in ``[0, min(max_wait, initial * 2**n)]``; after
    ``attempts`` tries the last error is raised.
    """

    attempts: int = 6
    initial: float = 0.05
    max_wait: float = 2.0

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()``, calling it again after a transient Redis/network error."""
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_random_exponential(multiplier=self.initial, max=self.max_wait),
            retry=retry_if_exception(is_transient),
            reraise=True,
        ):
            with attempt:
                return await call()
        raise AssertionError("unreachable: the last attempt returns or raises")
