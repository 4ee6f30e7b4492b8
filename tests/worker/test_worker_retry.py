"""``Worker.retrying``: every Redis step of a shard loop runs through it. A
call that works runs once; a connection error is retried with backoff until
it works (counted and logged each time); anything else, or any error once the
worker is stopping, is raised at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from support.no_redis import NoRedis

from processor.worker.worker import Worker, WorkerConfig


class Flaky:
    """Fails with ``errors`` in turn, then returns ``"done"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self, value: str) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return value


def _worker() -> Worker:
    return Worker(client=NoRedis(), config=WorkerConfig(namespace="retry-unit"))


def _retries(worker: Worker) -> float:
    return worker.metrics.redis_retries._value.get()


async def test_a_call_that_works_runs_once() -> None:
    worker, fn = _worker(), Flaky()
    assert await worker.retrying(fn, "done") == "done"
    assert fn.calls == 1 and _retries(worker) == 0


async def test_connection_errors_are_retried_until_it_works() -> None:
    worker = _worker()
    fn = Flaky(RedisConnectionError("down"), RedisConnectionError("down"),
               RedisConnectionError("down"))
    started = asyncio.get_running_loop().time()
    assert await worker.retrying(fn, "done") == "done"
    assert fn.calls == 4 and _retries(worker) == 3
    # Backoff: 0.05 s, 0.05 s, 0.1 s at least (plus up to 0.1 s jitter each).
    assert asyncio.get_running_loop().time() - started >= 0.2


@pytest.mark.parametrize("first", [True, False])
async def test_other_errors_are_raised_at_once(first: bool) -> None:
    worker = _worker()
    errors: list[Exception] = [ResponseError("WRONGTYPE")]
    if not first:
        errors.insert(0, RedisConnectionError("down"))
    fn = Flaky(*errors)
    with pytest.raises(ResponseError):
        await worker.retrying(fn, "done")
    assert fn.calls == len(errors)


async def test_a_stopping_worker_gives_up_on_a_connection_error() -> None:
    worker = _worker()
    worker.stop()
    fn = Flaky(RedisConnectionError("down"))
    with pytest.raises(RedisConnectionError):
        await worker.retrying(fn, "done")
    assert fn.calls == 1


async def test_stopping_while_retrying_gives_up() -> None:
    worker = _worker()
    errors: list[Any] = [RedisConnectionError("down")] * 50
    fn = Flaky(*errors)

    async def stop_soon() -> None:
        await asyncio.sleep(0.3)
        worker.stop()

    stopper = asyncio.create_task(stop_soon())
    with pytest.raises(RedisConnectionError):
        await worker.retrying(fn, "done")
    await stopper
    assert 2 <= fn.calls < 50
