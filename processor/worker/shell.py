"""What every part of a worker is given (``Shell``): its Redis client,
settings, scripts, metrics and dead-letter log, made once by
``Worker`` and shared by the paths it is
composed of (held, stored, recovery, continuity) and its shard runners."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from processor.scripts import Scripts
from processor.scripts.calls import BatchOptions
from processor.wire.keys import Shard
from processor.worker.config import WorkerConfig
from processor.worker.metrics import DeadLetterLog, Metrics

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

T = TypeVar("T")


def cancel_pending() -> bool:
    """Whether the running task has a cancel request pending (``Task.cancel``).
    A loop that must end on its cancel also checks this after each step: on
    Python 3.11, ``asyncio.wait_for`` drops a cancel that lands as the future
    it waits for completes (CPython gh-86296, fixed in 3.12), and redis-py
    sends every command under one when the client has a ``socket_timeout``."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def end_if_cancelled() -> None:
    """Raise ``CancelledError`` if a cancel is pending (``cancel_pending``)."""
    if cancel_pending():
        raise asyncio.CancelledError


async def run_together(*parts: Awaitable[None]) -> None:
    """Run ``parts`` as tasks until they have all ended. When one fails, or
    the caller is cancelled, the others are cancelled, and cancelled again
    while they run on (a cancel dropped, ``cancel_pending``), and the
    failure or the cancel is raised only once every one has ended: no part
    outlives the call (``asyncio.gather`` returns as soon as one fails or is
    cancelled, and leaves the others running)."""
    tasks = [asyncio.ensure_future(part) for part in parts]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        while running := [task for task in tasks if not task.done()]:
            for task in running:
                task.cancel()
            try:
                await asyncio.wait(running, timeout=0.1)
            except asyncio.CancelledError:
                continue  # (cancelled again: the parts end first all the same)
        raise


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, eq=False)
class Shell:
    """The worker's I/O and settings, shared by its parts."""

    # A redis-py asyncio client (Redis or RedisCluster, processor.redis_io.connections.connect).
    client: RedisClient
    config: WorkerConfig
    options: BatchOptions
    scripts: Scripts
    metrics: Metrics
    dead_letters: DeadLetterLog


class Apply(Protocol):
    """Apply entries read from a shard, a batch or one by one if the batch
    fails (``processor.worker.paths.Paths.apply_isolated``)."""

    def __call__(self, shard: Shard, entries: list[tuple[Any, Any]],
                 deliveries: dict[str, int]) -> Awaitable[None]: ...


class Retrying(Protocol):
    """Run a step until it succeeds, through connection errors
    (``processor.worker.worker.Worker.retrying``)."""

    def __call__(self, fn: Callable[..., Awaitable[T]], *args: Any) -> Awaitable[T]: ...
